"""
The driver interfaces: one per kind of hardware the pipeline touches. Steps call them only
through ``provisioning.drivers.drivers_for(region)``, so a region can run real protocol
clients while the embedded default runs simulated ones.

Every driver call may be repeated (a retried step calls it again): each interface has a read
that tells the step whether the change is already there, so a step can check before it acts.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from provisioning.drivers.pods import PodSpec


class DriverError(Exception):
    """A driver call failed. ``transient``: worth retrying (timeout, busy, 5xx); otherwise for good."""

    def __init__(self, message: str, *, transient: bool = True):
        super().__init__(message)
        self.transient = transient


class NotYet(DriverError):
    """The hardware (a node agent) has the work but has not answered yet: ask again in ``wait_s``."""

    def __init__(self, message: str, *, wait_s: float):
        super().__init__(message, transient=True)
        self.wait_s = wait_s


@dataclass(frozen=True)
class Target:
    """What a driver needs to know of a node: never the Django model (drivers stay plain)."""

    node_id: str
    hostname: str
    bmc_address: str = ""
    bmc_username: str = ""
    bmc_password: str = ""  # decrypted for the call only; never logged or put in an error

    def __repr__(self):
        return f"Target({self.hostname})"


class PowerDriver(ABC):
    """The BMC: power, boot device, virtual media (Redfish on real hardware)."""

    @abstractmethod
    def power_state(self, target: Target) -> str:
        """'on' or 'off'."""

    @abstractmethod
    def set_power(self, target: Target, on: bool) -> None: ...

    @abstractmethod
    def boot_device(self, target: Target) -> str:
        """'pxe', 'cd', 'hdd' or 'none'."""

    @abstractmethod
    def set_boot_device(self, target: Target, device: str) -> None: ...

    @abstractmethod
    def media(self, target: Target) -> str | None:
        """The URL of the image in the virtual CD drive, if any."""

    @abstractmethod
    def insert_media(self, target: Target, url: str) -> None: ...

    @abstractmethod
    def eject_media(self, target: Target) -> None: ...

    @abstractmethod
    def readings(self, target: Target) -> dict:
        """
        What the BMC measures, out of band (read-only): ``power_w`` (the chassis' draw, None when
        not offered), ``temperatures`` ([{"name", "context", "celsius"}], context as Redfish's
        PhysicalContext: "CPU", "GPU", "Intake"...) and ``health`` ("ok", "warning", "critical" or
        "unknown").
        """

    def console(self, target: Target) -> str:
        """The server's serial console output as the BMC keeps it ('' where it keeps none)."""
        return ""


class ImageDriver(ABC):
    """The node's disks, written by the deploy image: the OS image, and the wipe when cleaning."""

    @abstractmethod
    def image(self, target: Target) -> str | None:
        """The image written on the node's disk, None when blank."""

    @abstractmethod
    def deployed_for(self, target: Target) -> str | None:
        """Whose deployment the disk holds (the marker written with the image), None when blank."""

    @abstractmethod
    def write_image(self, target: Target, image: str, ssh_public_key: str, marker: str) -> None: ...

    @abstractmethod
    def wipe(self, target: Target) -> None: ...


class VMDriver(ABC):
    """A host's hypervisor (libvirt on real hosts)."""

    @abstractmethod
    def domain_state(self, target: Target, name: str) -> str:
        """'absent', 'defined' (shut off) or 'running'."""

    @abstractmethod
    def define(self, target: Target, name: str, xml: str) -> None: ...

    @abstractmethod
    def start(self, target: Target, name: str) -> None: ...

    @abstractmethod
    def stop(self, target: Target, name: str) -> None: ...

    @abstractmethod
    def undefine(self, target: Target, name: str) -> None: ...

    def console(self, target: Target, name: str) -> str:
        """The domain's serial console output ('' where the hypervisor keeps none for remote readers)."""
        return ""

    @abstractmethod
    def volume(self, target: Target, pool: str, name: str) -> str | None:
        """The path of volume ``name`` in the host's storage ``pool``, None when there is none."""

    @abstractmethod
    def create_volume(self, target: Target, pool: str, name: str, *, base: str, size_gib: int) -> str:
        """
        A copy-on-write qcow2 volume over the pool's volume ``base`` (the image, imported once per
        host), ``size_gib`` large; returns its path. A missing base fails for good, naming it.
        """

    @abstractmethod
    def delete_volume(self, target: Target, pool: str, name: str) -> None: ...


class ContainerDriver(ABC):
    """A shared host's container runtime, through the Kubernetes API of its cluster."""

    @abstractmethod
    def pod(self, target: Target, namespace: str, name: str) -> dict | None:
        """The pod as the API has it (``metadata.uid``, ``status``), None when there is no such pod."""

    @abstractmethod
    def apply(self, target: Target, spec: PodSpec) -> None:
        """Create what is missing of the instance's namespace, network policy, secret and pod."""

    @abstractmethod
    def delete(self, target: Target, namespace: str, name: str) -> None:
        """Delete the pod and its secret (the tenant's namespace stays for its other instances)."""


# What a host reports of each GPU's place in the node (provisioning.agent.topology), beside its identity.
PLACE_KEYS = ("nvlink_domain", "pcie_switch", "numa_node", "cpus")


class HostDriver(ABC):
    """
    What the node agent reports and does on a GPU host: its GPUs as NVML sees them, the GPU
    memory scrub between tenants, and signed attestation evidence for a challenge.
    """

    @abstractmethod
    def inventory(self, target: Target) -> list[dict]:
        """
        [{"index", "uuid", "healthy"}] for every GPU the host sees, with its place in the node
        (``PLACE_KEYS``: NVLink domain, PCIe switch, NUMA node and its CPUs) when the host knows it.
        """

    @abstractmethod
    def scrub(self, target: Target, devices: list[dict], reference: str = "") -> None:
        """Clear the tenant's memory on these GPUs (or slots); ``reference`` names who asked (an operation)."""

    @abstractmethod
    def scrubbed(self, target: Target, devices: list[dict], reference: str = "") -> bool:
        """True when the memory is clear; NotYet while an agent is still at it."""

    @abstractmethod
    def mig_layout(self, target: Target, index: int) -> str | None:
        """The MIG layout GPU ``index`` is cut into (None: MIG off)."""

    @abstractmethod
    def set_mig_layout(self, target: Target, index: int, layout: str, reference: str = "") -> None:
        """Cut GPU ``index`` into ``layout`` (it holds no one's work then); NotYet while an agent is at it."""

    def acceptance(self, target: Target, reference: str = "") -> dict:
        """
        The host's acceptance readings (security.acceptance): {"gpus": [per-GPU readings], "node":
        {"nccl_busbw_gbs", "ib_bandwidth_gbps"}}; NotYet while an agent is still at it.
        """
        raise DriverError(f"{type(self).__name__} cannot run acceptance checks.", transient=False)

    @abstractmethod
    def attest(self, target: Target, nonce: str, gpus: list[int], reference: str = "") -> dict:
        """
        The host's signed attestation evidence answering ``nonce`` for the GPUs at these indices
        (security.attestation.NodeEvidence as a dict); NotYet while an agent is still at it.
        """
