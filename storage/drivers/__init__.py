"""
Storage drivers: what a backend does for a volume, by its backend reference (``vol-<id>``) so every
call is idempotent -- a retried step asks for what exists already and is told it is done. Drivers
know no tenant and call no service. ``driver_for`` picks one by a storage class's ``backend``.
"""

from __future__ import annotations

from core.tracing import traced_driver
from storage.drivers.base import Export, StorageDriver, StorageDriverError
from storage.drivers.libvirt_pool import LibvirtPoolStorage
from storage.drivers.object_store import ObjectStore
from storage.drivers.scale import StorageScale
from storage.drivers.simulated import SimulatedStorage

DRIVERS: dict[str, type] = {"simulated": SimulatedStorage, "libvirt": LibvirtPoolStorage, "scale": StorageScale,
                           "s3": ObjectStore}


def driver_for(backend: str) -> StorageDriver:
    """The driver of a storage class's ``backend``; a backend not installed is an error for good."""
    try:
        driver = DRIVERS[backend]()
    except KeyError:
        raise StorageDriverError(f"No storage driver '{backend}' is installed (known: {', '.join(DRIVERS)}).",
                                 transient=False) from None
    return traced_driver("storage", driver)  # each call a span while tracing is on (core.tracing)


__all__ = ["DRIVERS", "Export", "StorageDriver", "StorageDriverError", "driver_for"]
