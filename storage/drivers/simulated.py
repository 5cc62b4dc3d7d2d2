"""
Simulated storage: the embedded default and the tests. Each volume's state lives in the database
(provisioning's SimulatedDevice, key ``storage:<ref>``), so it outlives a killed worker as a real
backend would, with every call counted. Faults come from ``settings.MERIDIAN_SIMULATION`` like the
simulated hardware's: ``failure_rate`` (transient) and ``broken_rate`` (for good) per action
(``storage_create``, ``storage_resize``, ``storage_delete``, ``storage_export``) or ``default``.
"""

from __future__ import annotations

import random

from django.conf import settings
from django.db import transaction

from provisioning.models import SimulatedDevice
from storage.drivers.base import Export, StorageDriverError

PREFIX = "storage:"


def _rate(name: str, action: str) -> float:
    table = settings.MERIDIAN_SIMULATION.get(name, {})
    return float(table.get(action, table.get("default", 0.0)))


class SimulatedStorage:
    def create(self, *, ref: str, kind: str, size_gib: int) -> None:
        self._act(ref, "storage_create", lambda s: s or {"kind": kind, "size_gib": size_gib, "clients": []})

    def resize(self, *, ref: str, size_gib: int) -> None:
        def grow(state):
            if not state:
                raise StorageDriverError(f"Simulated storage has no volume {ref} to resize.", transient=False)
            return {**state, "size_gib": max(state["size_gib"], size_gib)}

        self._act(ref, "storage_resize", grow)

    def delete(self, *, ref: str) -> None:
        self._act(ref, "storage_delete", lambda s: None)

    def export(self, *, ref: str, clients: tuple[str, ...]) -> Export:
        def limit(state):
            if not state:
                raise StorageDriverError(f"Simulated storage has no volume {ref} to export.", transient=False)
            return {**state, "clients": sorted(clients)}

        state = self._act(ref, "storage_export", limit)
        if state["kind"] == "block":
            return Export(target=f"/dev/disk/by-id/virtio-{ref[:20]}")
        return Export(target=f"sim-fs:/{ref}", clients=tuple(state["clients"]))

    def refs(self) -> set[str]:
        keys = SimulatedDevice.objects.filter(key__startswith=PREFIX).exclude(state={}).values_list("key", flat=True)
        return {key.removeprefix(PREFIX) for key in keys}

    @staticmethod
    def state(ref: str) -> dict:
        """What the backend holds of ``ref`` (empty: nothing), for tests and the console's evidence."""
        row = SimulatedDevice.objects.filter(key=PREFIX + ref).values_list("state", flat=True).first()
        return row or {}

    @staticmethod
    def calls(ref: str) -> dict:
        row = SimulatedDevice.objects.filter(key=PREFIX + ref).values_list("calls", flat=True).first()
        return row or {}

    def _act(self, ref: str, action: str, change) -> dict:
        """Count the call, maybe fail it as configured, then store ``change(state)`` (None: gone)."""
        key = PREFIX + ref
        with transaction.atomic():
            SimulatedDevice.objects.get_or_create(key=key)
            row = SimulatedDevice.objects.select_for_update().get(key=key)
            calls = {**row.calls, action: row.calls.get(action, 0) + 1}
            seed = settings.MERIDIAN_SIMULATION.get("seed", 0)
            roll = random.Random(f"{seed}|{key}|{action}|{calls[action]}").random()  # noqa: S311 -- fault injection
            fails = roll < max(_rate("broken_rate", action), _rate("failure_rate", action))
            if fails:  # the call is counted (it reached the backend), nothing changes
                SimulatedDevice.objects.filter(key=key).update(calls=calls)
            else:
                state = change(dict(row.state)) or {}
                SimulatedDevice.objects.filter(key=key).update(calls=calls, state=state)
        if fails:
            broken = roll < _rate("broken_rate", action)
            raise StorageDriverError(f"Simulated storage {'fault' if broken else 'timeout'}: {action} of {ref}.",
                                     transient=not broken)
        return state
