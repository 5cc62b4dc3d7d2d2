"""
What an instance mounts beyond its own disk: the volumes and file systems attached to its
reservation. Storage sits above provisioning, so provisioning asks the sources registered here
(``mount_source``; storage registers its own when it loads) rather than importing them; the
config drive (``cloud_init``) and the pod spec (``lifecycle.guest_steps``) turn the mounts into
cloud-init's ``mounts`` and the pod's volumes. So too what a hand-over waits for
(``handover_wait``): data on its way back to a volume the reservation asked for; and what the VPC
isolation report shows of the tenant's storage (``isolation_source``): who its exports let in.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Mount:
    volume: str  # the volume's name
    kind: str  # "block" (a disk the instance formats once) or "shared_fs" (a network file system)
    source: str  # a device path ("/dev/disk/by-id/...") or an export ("server:/path")
    path: str  # where it is mounted
    read_only: bool
    ref: str = ""  # the backend's name for it (a block volume's volume in the hosts' storage pool)

    def fstab(self) -> list[str]:
        """cloud-init's ``mounts`` entry: spec, path, type, options, dump, pass (nofail: a boot never hangs on it)."""
        options = ["ro" if self.read_only else "rw", "nofail"]
        if self.kind == "shared_fs":
            return [self.source, self.path, "nfs", ",".join([*options, "_netdev", "hard"]), "0", "0"]
        return [self.source, self.path, "auto", ",".join([*options, "x-systemd.device-timeout=30"]), "0", "2"]

    @property
    def server(self) -> str:
        return self.source.split(":", 1)[0]

    @property
    def export_path(self) -> str:
        return self.source.split(":", 1)[1] if ":" in self.source else self.source


SOURCES: list[Callable[[object], list[Mount]]] = []


def mount_source(source: Callable[[object], list[Mount]]) -> Callable[[object], list[Mount]]:
    """Register ``source(reservation) -> [Mount]`` (once: a second registration of it is ignored)."""
    if source not in SOURCES:
        SOURCES.append(source)
    return source


def mounts_for(reservation) -> list[Mount]:
    """Every mount of the reservation's instances, from every registered source, by path."""
    return sorted((mount for source in SOURCES for mount in source(reservation)), key=lambda m: m.path)


WAITS: list[Callable[[object], list[str]]] = []


def handover_wait(source: Callable[[object], list[str]]) -> Callable[[object], list[str]]:
    """Register ``source(reservation) -> [what the hand-over waits for, in words]`` (once)."""
    if source not in WAITS:
        WAITS.append(source)
    return source


def handover_waits(reservation) -> list[str]:
    """What the reservation's hand-over still waits for, from every registered source (empty: nothing)."""
    return [reason for source in WAITS for reason in source(reservation)]


REPORTS: list[Callable[[object], list[dict]]] = []


def isolation_source(source: Callable[[object], list[dict]]) -> Callable[[object], list[dict]]:
    """Register ``source(tenant_id) -> [rows]`` for the isolation report's storage section (once)."""
    if source not in REPORTS:
        REPORTS.append(source)
    return source


def isolation_rows(tenant_id) -> list[dict]:
    """The storage the tenant's networks reach, each with what its backend lets in now, from every source."""
    return [row for source in REPORTS for row in source(tenant_id)]

