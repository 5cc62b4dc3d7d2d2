"""
Drivers by kind, chosen per region from ``settings.MERIDIAN_DRIVERS`` (``"default"`` and region
slugs, each mapping a kind to an implementation name). Simulated everywhere by default.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib import import_module

from django.conf import settings

from .base import ContainerDriver, DriverError, HostDriver, ImageDriver, NotYet, PowerDriver, Target, VMDriver

IMPLEMENTATIONS = {
    "power": {"simulated": "simulated.SimulatedPower", "redfish": "redfish.RedfishPower"},
    "image": {"simulated": "simulated.SimulatedImage"},
    "vm": {"simulated": "simulated.SimulatedVM", "libvirt": "libvirt_vm.LibvirtVM"},
    "container": {"simulated": "simulated.SimulatedContainers"},
    "host": {"simulated": "simulated.SimulatedHost", "agent": "agent_host.AgentHost"},
}

__all__ = ["ContainerDriver", "DriverError", "Drivers", "HostDriver", "ImageDriver", "NotYet", "PowerDriver",
           "Target", "VMDriver", "drivers_for"]


@dataclass(frozen=True)
class Drivers:
    power: PowerDriver
    image: ImageDriver
    vm: VMDriver
    container: ContainerDriver
    host: HostDriver


def drivers_for(region_slug: str) -> Drivers:
    configured = settings.MERIDIAN_DRIVERS
    chosen = {**configured.get("default", {}), **configured.get(region_slug, {})}
    return Drivers(**{kind: _load(kind, chosen.get(kind, "simulated")) for kind in IMPLEMENTATIONS})


@cache
def _load(kind: str, name: str):
    try:
        path = IMPLEMENTATIONS[kind][name]
    except KeyError:
        raise DriverError(f"No {kind} driver '{name}' (known: {', '.join(IMPLEMENTATIONS[kind])}); "
                          "fix MERIDIAN_DRIVERS.", transient=False) from None
    module, cls = path.rsplit(".", 1)
    return getattr(import_module(f"{__name__}.{module}"), cls)()
