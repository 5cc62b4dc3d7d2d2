"""
The InfiniBand fabric driver: partitions (P_Keys) and their member port GUIDs.

One interface, three implementations: OpenSM's ``partitions.conf`` (``opensm.py``), NVIDIA
UFM's REST API (``ufm.py``) and a simulated fabric kept in the database (``simulated.py``),
chosen per fabric by ``settings.MERIDIAN_FABRICS``. Every call may be repeated (a retried step
or the reconciler calls it again) and ``read`` always tells what the fabric has, so callers check
after they act.

Port GUIDs are plain strings of 16 lower-case hex digits without ``0x`` (``cloud.guids.normal_guid``);
memberships are ``full`` or ``limited``. Two ports can talk over a partition they share when at
least one of them is a full member (InfiniBand Architecture Specification, 10.9.1), so tenant
ports are never full members of the default partition 0x7FFF.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from cloud.guids import normal_guid
from provisioning.drivers.base import DriverError

DEFAULT_PKEY = 0x7FFF
PKEY_MIN, PKEY_MAX = 0x0001, 0x7FFE
FULL, LIMITED = "full", "limited"
MEMBERSHIPS = (FULL, LIMITED)
MTUS = (256, 512, 1024, 2048, 4096)  # bytes; OpenSM and UFM number them 1..5
# Link rates a partition may be limited to (Gb/s), with the IB rate codes OpenSM writes (``rate=``)
# (IBA 1.2.1 table 205 and OpenSM's man page): 2.5, 10, 30, 5, 20, 40, 60, 80, 120, 14, 56, 112,
# 168, 25, 100, 200, 300, 28, 50, 400, 600.
RATE_CODES = {2.5: 2, 10: 3, 30: 4, 5: 5, 20: 6, 40: 7, 60: 8, 80: 9, 120: 10, 14: 11, 56: 12, 112: 13,
              168: 14, 25: 15, 100: 16, 200: 17, 300: 18, 28: 19, 50: 20, 400: 21, 600: 22}


@dataclass(frozen=True)
class PartitionSpec:
    """What a partition should be: its key, a name the fabric shows, and its IPoIB and QoS settings."""

    pkey: int
    name: str
    mtu: int = 4096
    rate_gbps: float | None = None  # None: the fabric's default
    service_level: int = 0
    ipoib: bool = True

    def __post_init__(self):
        if not (PKEY_MIN <= self.pkey <= PKEY_MAX or self.pkey == DEFAULT_PKEY):
            raise ValueError(f"P_Key {self.pkey:#06x} is outside 0x0001-0x7FFE.")
        if self.mtu not in MTUS:
            raise ValueError(f"MTU {self.mtu} is not one of {MTUS}.")
        if self.rate_gbps is not None and self.rate_gbps not in RATE_CODES:
            raise ValueError(f"Rate {self.rate_gbps} Gb/s is not an InfiniBand rate.")
        if not 0 <= self.service_level <= 15:
            raise ValueError(f"Service level {self.service_level} is outside 0-15.")


@dataclass
class Partition:
    """What the fabric has for one P_Key: its settings as read back and its members."""

    spec: PartitionSpec
    members: dict[str, str] = field(default_factory=dict)  # normal GUID -> "full" | "limited"


class FabricDriver(ABC):
    """One fabric's partitions. Methods raise DriverError (transient or not) and are idempotent."""

    @abstractmethod
    def read(self) -> dict[int, Partition]:
        """Every partition the fabric has, the default 0x7FFF included, by P_Key."""

    @abstractmethod
    def ensure_partition(self, spec: PartitionSpec) -> None:
        """Create the partition, or bring an existing one's settings to ``spec``; its members stay."""

    @abstractmethod
    def delete_partition(self, pkey: int) -> None:
        """Remove the partition and its memberships; nothing to do when it is not there."""

    @abstractmethod
    def set_members(self, pkey: int, members: Mapping[str, str]) -> None:
        """Add ports to an existing partition (or change their membership): GUID -> full | limited."""

    @abstractmethod
    def remove_members(self, pkey: int, guids: Iterable[str]) -> None:
        """Take ports out of a partition; those not in it are ignored."""

    def port_states(self, guids: Iterable[str]) -> dict[str, str]:
        """
        The link state of these ports as the fabric sees them: normal GUID -> "up" or "down"
        (a port the fabric does not know is left out). Read-only; what watches a bare-metal
        node while a tenant holds it. A fabric that cannot tell answers {} (nothing known).
        """
        return {}


def check_members(members: Mapping[str, str]) -> dict[str, str]:
    """Members with normal GUIDs; DriverError (for good) on a bad GUID or membership."""
    checked = {}
    for guid, membership in members.items():
        if membership not in MEMBERSHIPS:
            raise DriverError(f"Membership '{membership}' of {guid} is not full or limited.", transient=False)
        try:
            checked[normal_guid(guid)] = membership
        except ValueError as exc:
            raise DriverError(str(exc), transient=False) from None
    return checked
