"""
The control plane's own cost of moving checkpoints between tiers (storage.moves), on the simulated
backend (no data latency, so what is measured is Meridian's part: loading the move, the two driver
calls, the cursor's compare-and-set). BENCH_CHECKPOINTS (200) checkpoints of BENCH_CHUNKS (20)
chunks each are demoted, then restored, by 1 and by 2 worker processes (each its own database
connection). Two ways a move runs:

- step by step (``slice 0``): every run moves one chunk and sends the rest back to the queue, as a
  slice that ran out does -- the cost per step, re-dispatch included (the queue itself not counted);
- in slices (``slice 20 s``, the default): one run goes on chunk after chunk -- the cost per chunk.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/meridian .venv/bin/python bench/checkpoint_moves.py

It prints readable lines and one final ``RESULT {json}`` line.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import time

from common import drop_database, setup_django

DB = "meridian_bench_moves"
CHECKPOINTS = int(os.environ.get("BENCH_CHECKPOINTS", "200"))
CHUNKS = int(os.environ.get("BENCH_CHUNKS", "20"))
CHUNK = 1024


def world() -> list[str]:
    """A file system with a checkpoint policy and CHECKPOINTS checkpoints of CHUNKS chunks, all hot."""
    from django.utils import timezone

    from cloud.models import Region
    from storage.catalogue import default_storage_classes
    from storage.drivers.simulated import SimulatedStorage
    from storage.models import Checkpoint, CheckpointPolicy, Volume
    from tenants.models import Tenant

    tenant = Tenant.objects.create(name="Bench", slug="bench")
    region, _ = Region.objects.get_or_create(slug="us-east-1", defaults={"name": "US East"})
    classes = {c.kind: c for c in default_storage_classes(region)}
    fs, cold = (Volume.objects.create(tenant=tenant, name=name, storage_class=classes[kind], size_gib=1000,
                                      target_gib=1000, state="available") for name, kind in
                (("ckpt", "shared_fs"), ("archive", "object")))
    driver = SimulatedStorage()
    for volume, kind in ((fs, "shared_fs"), (cold, "object")):
        driver.create(ref=volume.backend_ref, kind=kind, size_gib=1000)
    CheckpointPolicy.objects.create(tenant=tenant, volume=fs, cold_volume=cold)
    now, size = timezone.now(), CHUNKS * CHUNK
    files = {f"checkpoints/step-{i}/model.pt": size for i in range(CHECKPOINTS)}
    from provisioning.models import SimulatedDevice  # the simulated backend's rows, written at once

    SimulatedDevice.objects.filter(key=f"storage:{fs.backend_ref}").update(state={
        "kind": "shared_fs", "size_gib": 1000, "clients": [],
        "files": {key: {"size": size, "modified": now.isoformat()} for key in files}})
    made = Checkpoint.objects.bulk_create(Checkpoint(
        tenant=tenant, volume=fs, name=key.split("/")[1], files={key: size}, size_bytes=size, written_at=now,
        last_used_at=now) for key in files)
    return [str(c.pk) for c in made]


def worker(ids: list[str], slice_s: float, out) -> None:
    from django.db import connections

    from storage.moves import checkpoint_move

    connections.close_all()  # a connection of its own, not the parent's
    runs = 0
    for pk in ids:
        while checkpoint_move(pk, slice_s=slice_s) == "continues":
            runs += 1
        runs += 1
    connections.close_all()
    out.put(runs)


def phase(ids: list[str], state: str, workers: int, slice_s: float) -> tuple[float, int]:
    """Start a move of every checkpoint into ``state``, then run them with ``workers`` processes."""
    from django.db import connections
    from django.utils import timezone

    from storage.models import Checkpoint

    Checkpoint.objects.filter(pk__in=ids).update(state=state, moved_bytes=0, cursor_file=0, cursor_chunk=0,
                                                 move_started_at=timezone.now())
    connections.close_all()
    out = multiprocessing.get_context("fork").Queue()
    pool = [multiprocessing.get_context("fork").Process(target=worker, args=(ids[i::workers], slice_s, out))
            for i in range(workers)]
    started = time.perf_counter()
    for process in pool:
        process.start()
    runs = sum(out.get() for _ in pool)
    for process in pool:
        process.join()
    seconds = time.perf_counter() - started
    target = "cold" if state == "demoting" else "hot"
    assert Checkpoint.objects.filter(pk__in=ids, state=target).count() == len(ids), "a move did not finish"
    return seconds, runs


def main():
    setup_django(DB)
    from django.conf import settings
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from storage import moves
    from storage.models import Checkpoint

    settings.MERIDIAN_STORAGE_CHUNK_BYTES = CHUNK
    moves.send = lambda *args, **kwargs: None  # the runs are driven here, not through a broker
    ids = world()
    chunks = len(ids) * (CHUNKS + 1)  # each file's chunks and its closing step
    results = {}
    for slice_s, label in ((0.0, "step"), (20.0, "slice")):
        for workers in (1, 2):
            demote_s, runs = phase(ids, "demoting", workers, slice_s)
            restore_s, _ = phase(ids, "restoring", workers, slice_s)
            key = f"{label}_{workers}w"
            results[key] = {"chunks_per_s": round(2 * chunks / (demote_s + restore_s)), "runs": runs,
                            "moves_per_s": round(2 * len(ids) / (demote_s + restore_s), 1)}
            print(f"{label:>5} runs, {workers} worker(s): {results[key]['chunks_per_s']} chunk steps/s, "
                  f"{results[key]['moves_per_s']} checkpoint moves/s ({CHUNKS} chunks each, {runs} runs to demote)")
    one = ids[0]
    Checkpoint.objects.filter(pk=one).update(state="demoting", moved_bytes=0, cursor_file=0, cursor_chunk=0)
    with CaptureQueriesContext(connection) as counted:
        moves.checkpoint_move(one, slice_s=0)
    results["queries_per_step"] = len(counted)
    print(f"queries per step (one chunk, simulated backend included): {len(counted)}")
    drop_database(DB)
    print("RESULT " + json.dumps(results))


if __name__ == "__main__":
    main()
