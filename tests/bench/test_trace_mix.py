"""
The mix workload of bench/trace_replay.py --workload mix on a one-node fleet: spot work takes the
headroom and is evicted softly by on-demand work, then resumes with what it had left; EASY backfill
books the first job that does not fit and backfills only what ends before its window.
"""

import sys
import uuid
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[2] / "bench"))  # after the repo: bench/provisioning.py

import trace_mix  # noqa: E402
import trace_replay  # noqa: E402

from provisioning.scheduling.plan_types import SHARED_POOL, GPUCapacity, NodeCapacity, Snapshot  # noqa: E402

MODEL = uuid.UUID(int=5)


def fleet() -> Snapshot:
    gpus = [GPUCapacity(uuid.uuid4(), i, 81920) for i in range(8)]
    node = NodeCapacity(uuid.uuid4(), trace_replay.REGION, uuid.UUID(int=1), uuid.UUID(int=2), 0, SHARED_POOL, MODEL,
                        gpus)
    return Snapshot(now=trace_replay.EPOCH, nodes=[node])


def job(idx: int, arrival: float, duration: float, gpus: int, tenant_class: str) -> trace_replay.Job:
    row = {"num_gpu": str(gpus), "gpu_milli": "1000", "tenant_class": tenant_class, "queue_s": ""}
    return trace_replay.Job(idx, row, arrival, duration)


def simulate(policy: str, jobs: list) -> dict:
    return trace_mix.MixSim(fleet(), {size: (MODEL,) for size in range(1, 9)}, policy).run([], jobs)


def test_tenant_classes_map_to_billing_terms():
    assert trace_mix.KINDS == {"LS": "on-demand", "Guaranteed": "on-demand", "Burstable": "reserved", "BE": "spot"}


def test_spot_in_the_headroom_is_evicted_after_the_grace_and_resumes_with_what_it_had_left():
    result = simulate("new", [job(0, 0.0, 1000.0, 8, "BE"), job(1, 10.0, 100.0, 1, "LS")])
    grace = trace_mix.GRACE_S
    assert result["by_kind"]["on-demand"]["max_s"] == grace  # it starts when the victim's grace ends
    assert result["evictions"]["count"] == 1 and result["evictions"]["distinct_jobs"] == 1
    # The spot job ran until its grace ended, waited for the on-demand job to end, then ran the rest.
    assert result["by_kind"]["spot"]["max_s"] == 100.0
    assert result["place_calls"] == 4 and result["headroom_refusals"] == 0
    assert abs(result["evictions"]["gpu_hours_lost_if_not_checkpointed"] - 8 * (10 + grace) / 3600) < 1e-9


def test_easy_backfill_books_the_head_and_backfills_only_what_ends_before_it():
    jobs = [job(0, 0.0, 1000.0, 4, "LS"), job(1, 1.0, 100.0, 8, "LS"), job(2, 2.0, 500.0, 2, "BE"),
            job(3, 3.0, 2000.0, 2, "BE")]
    result = simulate("easy", jobs)
    assert result["wait_s"]["max"] == 1097.0  # the last: it would have delayed the booked 8-GPU job
    assert result["by_kind"]["on-demand"]["max_s"] == 999.0  # booked at the first job's end
    assert result["by_kind"]["spot"]["mean_s"] == (0.0 + 1097.0) / 2  # the short one backfilled at once
    assert result["evictions"]["count"] == 0


def test_each_job_asks_for_one_model_and_the_models_are_loaded_alike_over_the_window():
    small, large = uuid.UUID(int=6), uuid.UUID(int=7)
    nodes = [NodeCapacity(uuid.uuid4(), trace_replay.REGION, uuid.UUID(int=1), uuid.UUID(int=2), 0, SHARED_POOL, model,
                          [GPUCapacity(uuid.uuid4(), i, 81920) for i in range(size)])
             for model, size, count in ((small, 4, 2), (large, 8, 1)) for _ in range(count)]
    models = {size: (small, large) if size <= 4 else (large,) for size in range(1, 9)}
    arrivals = [job(k, float(k), 100.0, 1 if k % 10 else 8, "LS") for k in range(40)]
    pins = trace_mix.pin_models(Snapshot(now=trace_replay.EPOCH, nodes=nodes), models, [], arrivals, by="window")
    assert all(len(pins[j.idx]) == 1 for j in arrivals)
    assert all(pins[j.idx] == (large,) for j in arrivals if j.gpus_per_unit == 8)  # only it holds 8
    held = {m: sum(j.gpu_eq * 100.0 for j in arrivals if pins[j.idx] == (m,)) for m in (small, large)}
    assert held[large] >= 4 * 8 * 100.0 and held[small] > 0
    assert abs(held[small] - held[large]) / 8 <= 100.0 / 8  # GPU-seconds per GPU: within one small job's


def test_each_job_asks_for_the_model_least_loaded_at_its_arrival():
    """
    A customer picks the model with room now: with a long job holding 6 of the large model's 8
    GPUs, short jobs go to the small model until it is as busy, then alternate; balanced over the
    window instead, the long job's hour keeps them all off the large model, whatever runs now.
    """
    small, large = uuid.UUID(int=6), uuid.UUID(int=7)
    nodes = [NodeCapacity(uuid.uuid4(), trace_replay.REGION, uuid.UUID(int=1), uuid.UUID(int=2), 0, SHARED_POOL, model,
                          [GPUCapacity(uuid.uuid4(), i, 81920) for i in range(size)])
             for model, size, count in ((small, 4, 2), (large, 8, 1)) for _ in range(count)]
    models = {1: (small, large), 6: (large,)}
    arrivals = [job(0, 0.0, 10_000.0, 6, "LS")] + [job(k, float(k), 50.0, 1, "LS") for k in range(1, 13)]
    fleet = Snapshot(now=trace_replay.EPOCH, nodes=nodes)
    at_arrival = [trace_mix.pin_models(fleet, models, [], arrivals)[j.idx] for j in arrivals[1:]]
    assert at_arrival[:7] == [(small,)] * 7  # 7 of 8 small GPUs busy: as busy as the large model
    assert at_arrival[7:] == [(large,), (small,), (large,), (small,), (large,)]  # then they take turns
    over_window = [trace_mix.pin_models(fleet, models, [], arrivals, by="window")[j.idx] for j in arrivals[1:]]
    assert over_window == [(small,)] * 12
