"""
Where the fast path looks first: the nodes a recent read of a pool found with free GPUs.

Choosing the best-fitting hosts (or the preferred leaf's whole-free nodes) means counting the free
GPUs of every node in the pool: on 1,280 nodes most of a create's database time, on every create.
``FreeHint`` keeps, per process and per kind of request (pool, regions, GPU models, fabric, GPUs
per unit), the candidates such a read found with their free counts, for
``MERIDIAN_FAST_PATH_HINT_SECONDS``. A create within that time reads only the nodes the hint
chooses -- their free GPUs counted again, in its own transaction, so what it plans on is exact --
and the hint learns what that read saw and what the create took. When those nodes no longer hold
the request, or the hint is older than that, the create reads the pool as before and the hint
starts again from that read.

A stale hint costs placement quality, never correctness: a host freed meanwhile is not
preferred until the next full read, and GPUs taken by another process are seen by the exact
read (or refused by the database's exclusion constraint when two creates race for them).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

from django.conf import settings

from provisioning.scheduling.plan_types import Placement, Request, Snapshot
from provisioning.scheduling.snapshot import choose_nodes, free_snapshot

# Candidates a full read keeps beyond the request's own: what the next creates choose from.
HINT_SPARE = 32


class FreeHint:
    """Per process: per kind of request, the nodes with free GPUs a recent read found (thread-safe)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._pools: dict[tuple, tuple[float, dict]] = {}  # key -> (read at, node -> [leaf, free GPUs])

    def snapshots(self, request: Request, *, now) -> Iterator[Snapshot]:
        """Free capacity to plan ``request`` on, best guess first: the hinted nodes, then a read of the pool."""
        key = _key(request)
        chosen = self._choose(key, request)
        if chosen and (snapshot := free_snapshot(request, now=now, nodes=chosen)) is not None:
            self._saw(key, chosen, snapshot)
            yield snapshot
        # Nothing hinted, or the hinted nodes no longer hold it: the pool is read, and hinted anew.
        snapshot = free_snapshot(request, now=now, spare=HINT_SPARE)
        self._remember(key, snapshot)
        if snapshot is not None:
            yield snapshot

    def took(self, request: Request, placement: Placement) -> None:
        """The GPUs a create was placed on are not free any more (as far as this process knows)."""
        with self._lock:
            entry = self._pools.get(_key(request))
            if entry is None:
                return
            for assignment in placement.assignments:
                if (node := entry[1].get(assignment.node_id)) is not None:
                    node[1] -= 1

    def clear(self) -> None:
        with self._lock:
            self._pools.clear()

    def _choose(self, key: tuple, request: Request) -> list | None:
        with self._lock:
            entry = self._pools.get(key)
            if entry is None or time.monotonic() - entry[0] > settings.MERIDIAN_FAST_PATH_HINT_SECONDS:
                return None
            rows = [(node, leaf, free) for node, (leaf, free) in entry[1].items()]
        # Two more than it needs (a count may have gone stale); bare metal: of the tightest leaf only.
        return choose_nodes(rows, request, spare=2, leaves=1)

    def _saw(self, key: tuple, chosen: list, snapshot: Snapshot) -> None:
        """An exact read of the hinted nodes: their free counts now (those it did not return have none)."""
        seen = {node.node_id: len(node.gpus) for node in snapshot.nodes}
        with self._lock:
            entry = self._pools.get(key)
            if entry is None:
                return
            for node_id in chosen:
                if (node := entry[1].get(node_id)) is not None:
                    node[1] = seen.get(node_id, 0)

    def _remember(self, key: tuple, snapshot: Snapshot | None) -> None:
        nodes = {node.node_id: [node.leaf_id, len(node.gpus)] for node in snapshot.nodes} if snapshot else {}
        with self._lock:
            if nodes:
                self._pools[key] = (time.monotonic(), nodes)
            else:
                self._pools.pop(key, None)


def _key(request: Request) -> tuple:
    return (request.kind, request.regions, request.gpu_model_ids, request.fabric_id, request.gpus_per_unit,
            request.confidential)


FREE_HINT = FreeHint()
