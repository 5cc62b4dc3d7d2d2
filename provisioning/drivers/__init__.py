"""
Drivers by kind, chosen per region from ``settings.MERIDIAN_DRIVERS`` (``"default"`` and region
slugs, each mapping a kind to an implementation name). Simulated everywhere by default.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib import import_module

from django.conf import settings

from core.tracing import traced_driver
from provisioning.drivers.base import (
    ContainerDriver,
    DriverError,
    HostDriver,
    ImageDriver,
    NotYet,
    PowerDriver,
    Target,
    VMDriver,
)
from provisioning.drivers.fabric import FabricDriver

IMPLEMENTATIONS = {
    "power": {"simulated": "simulated.SimulatedPower", "redfish": "redfish.RedfishPower"},
    "image": {"simulated": "simulated.SimulatedImage"},
    "vm": {"simulated": "simulated.SimulatedVM", "libvirt": "libvirt_vm.LibvirtVM"},
    "container": {"simulated": "simulated.SimulatedContainers", "kubernetes": "kubernetes_pods.KubernetesContainers"},
    "host": {"simulated": "simulated.SimulatedHost", "agent": "agent_host.AgentHost"},
}

__all__ = ["ContainerDriver", "DriverError", "Drivers", "FabricDriver", "HostDriver", "ImageDriver", "NotYet",
           "PowerDriver", "Target", "VMDriver", "drivers_for", "fabric_driver_for"]


@dataclass(frozen=True)
class Drivers:
    power: PowerDriver
    image: ImageDriver
    vm: VMDriver
    container: ContainerDriver
    host: HostDriver


FABRIC_IMPLEMENTATIONS = {"simulated": "simulated.SimulatedFabric", "opensm": "opensm.OpenSMFabric",
                          "ufm": "ufm.UFMFabric"}


def fabric_driver_for(fabric) -> FabricDriver:
    """
    The driver of one fabric, from ``settings.MERIDIAN_FABRICS``: ``"default"`` and
    ``"<region>/<fabric>"`` keys, each ``{"driver": name, ...its settings}`` (UFM: url, username,
    password, verify_tls; OpenSM: path, reread_command). Simulated fabrics are named after theirs.
    """
    configured = settings.MERIDIAN_FABRICS
    key = f"{fabric.region.slug}/{fabric.slug}"
    chosen = dict(configured.get(key) or configured.get("default") or {"driver": "simulated"})
    name = chosen.pop("driver", "simulated")
    if name == "simulated":
        chosen.setdefault("name", key)
    try:
        path = FABRIC_IMPLEMENTATIONS[name]
    except KeyError:
        raise DriverError(f"No fabric driver '{name}' (known: {', '.join(FABRIC_IMPLEMENTATIONS)}); "
                          "fix MERIDIAN_FABRICS.", transient=False) from None
    module, cls = path.rsplit(".", 1)
    try:
        return traced_driver("fabric", getattr(import_module(f"{__name__}.{module}"), cls)(**chosen))
    except TypeError as exc:
        raise DriverError(f"MERIDIAN_FABRICS for {key} does not suit the {name} driver: {exc}", transient=False) \
            from None


def drivers_for(region_slug: str) -> Drivers:
    configured = settings.MERIDIAN_DRIVERS
    chosen = {**configured.get("default", {}), **configured.get(region_slug, {})}
    # Each call a span while tracing is on (core.tracing); the drivers themselves otherwise.
    return Drivers(**{kind: traced_driver(kind, _load(kind, chosen.get(kind, "simulated"), region_slug))
                      for kind in IMPLEMENTATIONS})


@cache
def _load(kind: str, name: str, region_slug: str):
    try:
        path = IMPLEMENTATIONS[kind][name]
    except KeyError:
        raise DriverError(f"No {kind} driver '{name}' (known: {', '.join(IMPLEMENTATIONS[kind])}); "
                          "fix MERIDIAN_DRIVERS.", transient=False) from None
    module, name = path.rsplit(".", 1)
    cls = getattr(import_module(f"{__name__}.{module}"), name)
    # A driver whose endpoint differs by region (a region's Kubernetes cluster) is made per region.
    return cls(region=region_slug) if getattr(cls, "per_region", False) else cls()
