"""
The pure planner with time-sliced slots: they pack by slice class and size, never share a GPU with
another class or with memory-capped slots, and at most eight share one GPU.
"""

from __future__ import annotations

import uuid

from provisioning.scheduling.plan_types import CONTAINER, Busy
from provisioning.scheduling.planner import Planner, plan
from tests.provisioning.test_planner import HOUR, MEM, NOW, ask, gpus_of, occupy, shared, snapshot


def sliced(units: int = 1, n: int = 4, klass: str = "realtime", **kwargs):
    return ask(CONTAINER, units=units, per_unit=1, slots_per_gpu=n, share_class=klass, **kwargs)


def book(gpu, n: int, k: int, klass: str) -> None:
    gpu.busy.append(Busy(uuid.uuid4(), NOW - HOUR, NOW + 10 * HOUR, k * MEM // n, (k + 1) * MEM // n,
                         share_class=klass))
    gpu.busy.sort(key=lambda b: b.start)


def test_slices_of_one_class_pack_onto_the_gpu_already_sliced_for_it():
    node = shared(1, gpus=4)[0]
    book(node.gpus[2], 4, 0, "realtime")
    placement = Planner(snapshot([node])).place(sliced(units=3))
    assert gpus_of(placement) == {node.gpus[2].gpu_id}
    assert {a.share_class for a in placement.assignments} == {"realtime"}


def test_a_gpu_sliced_for_another_class_is_never_joined():
    node = shared(1, gpus=2)[0]
    book(node.gpus[0], 4, 0, "training")
    occupy(node.gpus[1])  # the other GPU is busy whole
    planner = Planner(snapshot([node]))
    assert planner.place(sliced(klass="realtime")) is None
    assert "time-sliced for realtime work" in planner.last_reason
    # The training GPU still takes training slices.
    assert gpus_of(planner.place(sliced(klass="training"))) == {node.gpus[0].gpu_id}


def test_time_slices_and_memory_capped_slots_never_mix_on_a_gpu():
    node = shared(1, gpus=1)[0]
    occupy(node.gpus[0], lo=0, hi=MEM // 4)  # a plain quarter slot
    planner = Planner(snapshot([node]))
    assert planner.place(sliced(n=4)) is None


def test_at_most_eight_tasks_share_a_gpu_and_classes_start_their_own_gpus():
    node = shared(1, gpus=3)[0]
    queue = [sliced(n=8, klass="realtime") for _ in range(9)] + [sliced(n=8, klass="batch")]
    result = plan(snapshot([node]), queue)
    by_gpu: dict = {}
    for p in result.placements:
        for a in p.assignments:
            by_gpu.setdefault(a.gpu_id, set()).add((a.share_class, a.mem_lo))
    assert len(result.placements) == 10
    assert all(len(slots) <= 8 for slots in by_gpu.values())
    assert all(len({c for c, _ in slots}) == 1 for slots in by_gpu.values())  # one class a GPU
    assert sorted(len(s) for s in by_gpu.values()) == [1, 1, 8]


def test_different_sizes_of_one_class_do_not_share_a_gpu():
    node = shared(1, gpus=2)[0]
    book(node.gpus[0], 2, 0, "batch")
    placement = Planner(snapshot([node])).place(sliced(n=4, klass="batch"))
    assert gpus_of(placement) == {node.gpus[1].gpu_id}


def test_spot_slices_of_another_class_are_not_evicted_into_a_mixed_gpu():
    """Evicting for slices only looks at GPUs sliced the same way: a victim never leaves a mixed GPU."""
    node = shared(1, gpus=1)[0]
    node.gpus[0].busy.append(Busy(uuid.uuid4(), NOW - HOUR, NOW + 10 * HOUR, 0, MEM // 4,
                                  preemptible=True, priority=0.1, share_class="training"))
    planner = Planner(snapshot([node]))
    assert planner.place(sliced(n=4, klass="realtime", priority=0.9)) is None
