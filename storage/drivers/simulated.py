"""
Simulated storage: the embedded default and the tests. Each volume's state lives in the database
(provisioning's SimulatedDevice, key ``storage:<ref>``), so it outlives a killed worker as a real
backend would, with every call counted. Faults come from ``settings.MERIDIAN_SIMULATION`` like the
simulated hardware's: ``failure_rate`` (transient) and ``broken_rate`` (for good) per action
(``storage_create``, ``storage_resize``, ``storage_delete``, ``storage_export``) or ``default``.
"""

from __future__ import annotations

import random
import secrets

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from provisioning.models import SimulatedDevice
from storage.data import FileInfo, checked_key
from storage.drivers.base import Export, StorageDriverError

PREFIX = "storage:"


def _rate(name: str, action: str) -> float:
    table = settings.MERIDIAN_SIMULATION.get(name, {})
    return float(table.get(action, table.get("default", 0.0)))


class SimulatedStorage:
    def create(self, *, ref: str, kind: str, size_gib: int, source: tuple[str, str] | None = None) -> None:
        files = {}
        if source is not None:
            taken = self.state(source[0]).get("snapshots", {}).get(source[1])
            if taken is None:
                raise StorageDriverError(f"Simulated storage has no snapshot {source[1]} of {source[0]}.",
                                         transient=False)
            files = taken
        self._act(ref, "storage_create", lambda s: s or {"kind": kind, "size_gib": size_gib, "clients": [],
                                                         **({"files": files} if files else {})})

    def snapshot(self, *, ref: str, snapshot: str) -> None:
        def take(state):
            if not state:
                raise StorageDriverError(f"Simulated storage has no volume {ref} to snapshot.", transient=False)
            taken = dict(state.get("snapshots", {}))
            taken.setdefault(snapshot, dict(state.get("files", {})))
            return {**state, "snapshots": taken}

        self._act(ref, "storage_snapshot", take)

    def snapshot_delete(self, *, ref: str, snapshot: str) -> None:
        def drop(state):
            if not state:
                return state
            return {**state, "snapshots": {k: v for k, v in state.get("snapshots", {}).items() if k != snapshot}}

        self._act(ref, "storage_snapshot", drop)

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

    def exports(self, *, refs: set[str]) -> dict[str, tuple[str, ...]]:
        """These file systems' and buckets' allowed clients, by reference (the isolation report)."""
        rows = SimulatedDevice.objects.filter(key__in=[PREFIX + ref for ref in refs]).exclude(state={}).values_list(
            "key", "state")
        return {key.removeprefix(PREFIX): tuple(state.get("clients", ())) for key, state in rows
                if state.get("kind") in ("shared_fs", "object")}

    def credentials(self, *, ref: str) -> dict:
        """New keys for a bucket (a simulated object store keeps only their fingerprint)."""
        secret = secrets.token_urlsafe(30)
        key_id = "SIM" + secrets.token_hex(8).upper()

        def issue(state):
            if state.get("kind") != "object":
                raise StorageDriverError(f"Simulated storage has no bucket {ref}.", transient=False)
            return {**state, "keys": [*state.get("keys", [])[-1:], key_id]}

        self._act(ref, "storage_credentials", issue)
        return {"access_key_id": key_id, "secret_access_key": secret, "bucket": ref, "endpoint": "sim-s3://"}

    # -- files: sizes only; what is read back is zeros of the chunk's length ------------------------

    def files(self, *, ref: str, prefix: str) -> dict[str, FileInfo]:
        held = self.state(ref).get("files", {})
        return {key: FileInfo(size=f["size"], modified=parse_datetime(f["modified"]))
                for key, f in held.items() if key.startswith(prefix)}

    def read_chunk(self, *, ref: str, key: str, index: int, chunk: int) -> bytes:
        held = self.state(ref).get("files", {}).get(checked_key(key))
        if held is None:
            raise StorageDriverError(f"{ref} has no file {key} to read.", transient=False)
        self._act(ref, "storage_read", lambda state: state)
        return bytes(max(0, min(chunk, held["size"] - index * chunk)))  # zeros: only the length is kept

    def write_chunk(self, *, ref: str, key: str, index: int, chunk: int, data: bytes) -> None:
        key = checked_key(key)

        def write(state):
            if not state:
                raise StorageDriverError(f"Simulated storage has no volume {ref} to write to.", transient=False)
            files = dict(state.get("files", {}))
            size = max(files.get(key, {}).get("size", 0), index * chunk + len(data))
            files[key] = {"size": size, "modified": timezone.now().isoformat()}
            return {**state, "files": files}

        self._act(ref, "storage_write", write)

    def truncate(self, *, ref: str, key: str, size: int) -> None:
        key = checked_key(key)

        def cut(state):
            files = dict(state.get("files", {}))
            if key in files:
                files[key] = {**files[key], "size": size}
            return {**state, "files": files}

        self._act(ref, "storage_write", cut)

    def remove(self, *, ref: str, key: str) -> None:
        key = checked_key(key)

        def drop(state):
            files = {k: f for k, f in state.get("files", {}).items() if k != key}
            return {**state, "files": files} if state else state

        self._act(ref, "storage_remove", drop)

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
