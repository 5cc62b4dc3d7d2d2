"""
Fleet alerts over the 1-minute telemetry rollups (rows made here directly): fluctuating
utilization and XID bursts open one platform incident per node and resolve it when the condition
clears; idle reserved GPUs tell the tenant once. Every run is idempotent.
"""

from __future__ import annotations

import threading
import uuid
from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.db import connection

from cloud.leader import LeaderLock
from cloud.models import GPU, GPUSampleRollup, Node
from operations.alerts import (
    FLUCTUATION,
    IDLE_NOTICE,
    REPEATED_XIDS,
    AlertPolicy,
    GPUWindow,
    alerts_evaluate,
    judge_gpu,
    node_findings,
)
from provisioning.models import Allocation, Reservation
from security.models import Incident
from tenants.models import Notification
from tests.world import h100, small_fleet, vm_offering

NOW = datetime(2026, 11, 20, 12, 0, 30, tzinfo=UTC)
MINUTE = timedelta(minutes=1)


def minute(ago: int) -> datetime:
    """The start of the minute bucket ``ago`` minutes before NOW's minute."""
    return NOW.replace(second=0) - ago * MINUTE


def rollup(gpu: GPU, ago: int, values: list[int], *, processes: bool = True, xids: int = 0) -> GPUSampleRollup:
    """One minute of a GPU's samples (utilization %), as the ingestion rolls them up."""
    idle = sum(1 for v in values if v == 0 and not processes)
    return GPUSampleRollup.objects.create(
        gpu=gpu, period="1m", bucket=minute(ago), samples=len(values), utilization_samples=len(values),
        utilization_sum=sum(values),
        utilization_sumsq=sum(v * v for v in values), utilization_max=max(values), xid_count=xids, idle_samples=idle)


def minutes_of(gpu: GPU, count: int, values: list[int], **kwargs) -> None:
    for ago in range(count):
        rollup(gpu, ago, values, **kwargs)


@pytest.fixture
def nodes(db):
    small_fleet(4)
    return list(Node.objects.order_by("hostname"))


def gpus_of(node: Node) -> list[GPU]:
    return list(GPU.objects.filter(node=node).order_by("index"))


#
# Judging (pure)
#


def window(values: list[int], xids: int = 0, node=None, index=0) -> GPUWindow:
    return GPUWindow(uuid.uuid4(), index, node or uuid.UUID(int=1), "node-1", len(values), float(sum(values)),
                     float(sum(v * v for v in values)), xids)


def test_the_coefficient_of_variation_is_std_over_mean():
    """50 and 90 alternating: mean 70, std 20, std/mean 0.2857 > 0.15; 78 and 82: 0.0250, steady."""
    policy = AlertPolicy()
    fluctuating = window([50, 90] * 30)
    assert (fluctuating.mean, fluctuating.std) == (70, 20)
    assert judge_gpu(fluctuating, policy) == pytest.approx(20 / 70)
    assert judge_gpu(window([78, 82] * 30), policy) is None
    assert judge_gpu(window([0, 4] * 30), policy) is None  # mean 2 %: not busy enough to judge
    assert judge_gpu(window([60]), policy) is None  # one sample says nothing about fluctuation


def test_idle_gpus_beside_busy_ones_are_not_fluctuation():
    """A shared host: 4 GPUs steady at 90 %, 4 idle. Pooled, std/mean would be 1.0; per GPU it is steady."""
    windows = [window([90] * 60, index=i) for i in range(4)] + [window([0] * 60, index=i) for i in range(4, 8)]
    findings, judged = node_findings(windows, AlertPolicy())
    assert findings == [] and judged == {uuid.UUID(int=1)}


def test_xids_add_up_across_a_nodes_gpus():
    windows = [window([80] * 6, xids=1, index=0), window([80] * 6, xids=2, index=5)]
    (finding,) = node_findings(windows, AlertPolicy())[0]
    assert finding.kind == REPEATED_XIDS and finding.evidence["xids"] == 3 and finding.evidence["gpus"] == {"0": 1,
                                                                                                           "5": 2}
    assert node_findings(windows[:1], AlertPolicy())[0] == []


#
# Incidents
#


def test_a_fluctuating_gpu_opens_one_incident_for_its_node_and_it_resolves_when_steady(nodes):
    node = nodes[1]
    gpus = gpus_of(node)
    minutes_of(gpus[2], 10, [50, 90, 50, 90, 50, 90])
    minutes_of(gpus[3], 10, [80, 80, 81, 79, 80, 80])

    result = alerts_evaluate(now=NOW)

    assert (result["opened"], result["nodes_judged"]) == (1, 1)
    incident = Incident.objects.get(kind=FLUCTUATION)
    assert incident.node_id == node.pk and incident.tenant_id is None and incident.resolved_at is None
    assert [g["index"] for g in incident.evidence["gpus"]] == [2]
    assert incident.evidence["gpus"][0]["cv"] == round(20 / 70, 3)
    assert node.hostname in incident.summary and "0.29" in incident.summary
    assert incident.impact_started_at == NOW - timedelta(minutes=10)

    again = alerts_evaluate(now=NOW + timedelta(seconds=20))
    assert again["opened"] == 0 and Incident.objects.filter(kind=FLUCTUATION).count() == 1

    later = NOW + timedelta(minutes=15)  # the fluctuating minutes are out of the window; the GPU is steady now
    GPUSampleRollup.objects.all().delete()
    for ago in range(10):
        GPUSampleRollup.objects.create(gpu=gpus[2], period="1m", bucket=later.replace(second=0) - ago * MINUTE,
                                       samples=6, utilization_samples=6, utilization_sum=480,
                                       utilization_sumsq=6 * 80 * 80)
    assert alerts_evaluate(now=later)["resolved"] == 1
    incident.refresh_from_db()
    assert incident.resolved_at == later


def test_samples_without_a_utilization_reading_are_left_out_of_the_mean(nodes):
    """Minutes whose samples had no utilization reading (NVML not answering) neither dilute the mean nor fluctuate."""
    gpu = gpus_of(nodes[1])[0]
    for ago in range(10):
        GPUSampleRollup.objects.create(gpu=gpu, period="1m", bucket=minute(ago), samples=6, utilization_samples=3,
                                       utilization_sum=3 * 80, utilization_sumsq=3 * 80 * 80)
    assert alerts_evaluate(now=NOW) == {"opened": 0, "resolved": 0, "idle_notified": 0, "nodes_judged": 1}


def test_an_alert_stays_open_while_the_node_sends_no_telemetry(nodes):
    minutes_of(gpus_of(nodes[1])[0], 10, [30, 90] * 3)
    alerts_evaluate(now=NOW)
    GPUSampleRollup.objects.all().delete()
    assert alerts_evaluate(now=NOW + timedelta(minutes=30))["resolved"] == 0
    assert Incident.objects.get(kind=FLUCTUATION).resolved_at is None


def test_repeated_xids_on_one_node_open_an_incident(nodes):
    a, b = gpus_of(nodes[2])[:2]
    rollup(a, 1, [80] * 6, xids=2)
    rollup(b, 4, [80] * 6, xids=1)
    rollup(gpus_of(nodes[3])[0], 1, [80] * 6, xids=2)  # another node: 2, below the threshold
    rollup(a, 30, [80] * 6, xids=9)  # outside the window

    alerts_evaluate(now=NOW)
    alerts_evaluate(now=NOW)

    incident = Incident.objects.get(kind=REPEATED_XIDS)
    assert incident.node_id == nodes[2].pk and incident.evidence["xids"] == 3
    assert not Incident.objects.filter(kind=FLUCTUATION).exists()


def test_the_thresholds_are_settings(nodes, settings):
    settings.MERIDIAN_ALERT_XIDS = 10
    settings.MERIDIAN_ALERT_FLUCTUATION = 0.5
    settings.MERIDIAN_ALERT_WINDOW_MIN = 5
    gpu = gpus_of(nodes[1])[0]
    minutes_of(gpu, 5, [50, 90] * 3, xids=1)  # std/mean 0.29 < 0.5; 5 XIDs < 10
    rollup(gpu, 7, [50, 90] * 3, xids=20)  # outside the 5-minute window
    assert alerts_evaluate(now=NOW)["opened"] == 0


def test_the_task_runs_the_evaluation(nodes):
    from operations.tasks import alerts_evaluate as task

    minutes_of(gpus_of(nodes[1])[0], 10, [20, 95] * 3)
    with time_machine.travel(NOW, tick=False):
        result = task.apply().get()
    assert result["opened"] == 1 and Incident.objects.filter(kind=FLUCTUATION).count() == 1


#
# Idle reserved GPUs
#


@pytest.fixture
def held(world, nodes):
    """An active t1 reservation of 4 GPUs of one node, held since 2 hours ago."""
    reservation = Reservation.objects.create(
        tenant=world.t1.tenant, team=world.t1.team, name="finetune", offering=vm_offering(), gpu_model=h100(),
        units=4, gpus=4, regions=["us-east-1"], duration=timedelta(hours=4), state="active",
        starts_at=NOW - timedelta(hours=2), ends_at=NOW + timedelta(hours=2))
    gpus = gpus_of(nodes[1])[:4]
    for gpu in gpus:
        Allocation.objects.create(reservation=reservation, gpu=gpu, node=gpu.node, mem_lo=0, mem_hi=gpu.memory_mib,
                                  starts_at=NOW - timedelta(hours=2), ends_at=NOW + timedelta(hours=2))
    return reservation, gpus


def idle_notices(world):
    return list(Notification.objects.filter(tenant=world.t1.tenant, kind=IDLE_NOTICE))


def test_idle_reserved_gpus_tell_the_tenant_once_with_the_evidence(world, held):
    reservation, gpus = held
    for gpu in gpus[:3]:
        minutes_of(gpu, 30, [0] * 6, processes=False)
    minutes_of(gpus[3], 30, [0, 0, 0, 0, 0, 35])  # one busy sample: in use

    with time_machine.travel(NOW, tick=False):
        assert alerts_evaluate()["idle_notified"] == 1

    (notice,) = idle_notices(world)
    assert notice.team_id == world.t1.team.pk and notice.user_id is None
    assert notice.link == f"/reservations/{reservation.pk}/"
    assert notice.title == "3 of 4 GPUs of finetune idle for 30 minutes"
    assert "0 % utilization and no process in every one of their 540 samples" in notice.body
    assert "11:30 to 12:00 UTC" in notice.body
    # Seen by the tenant (its team's members), never by another tenant.
    titles = {row["title"] for row in world.client("t1_admin").get("/api/v1/notifications/").json()["results"]}
    assert notice.title in titles
    assert notice.title not in world.client("t2_member").get("/api/v1/notifications/").content.decode()

    with time_machine.travel(NOW + timedelta(minutes=1), tick=False):
        assert alerts_evaluate()["idle_notified"] == 0
    assert len(idle_notices(world)) == 1


def test_the_tenant_is_told_again_after_a_whole_idle_period(world, held):
    _, gpus = held
    for ago in range(0, 70):
        rollup(gpus[0], ago, [0] * 6, processes=False)
    for minutes_before in (31, 15, 0):
        with time_machine.travel(NOW - timedelta(minutes=minutes_before), tick=False):
            alerts_evaluate()
    assert len(idle_notices(world)) == 2  # at -31 min and at 0: never twice within 30 minutes


@pytest.mark.parametrize("case", ["gaps", "busy", "just-started", "released"])
def test_no_notice_without_evidence_of_a_whole_idle_period(world, held, case):
    reservation, gpus = held
    if case == "gaps":  # telemetry for 20 of 30 minutes: not enough to call it idle
        for ago in range(0, 30, 3):
            rollup(gpus[0], ago, [0] * 6, processes=False)
            rollup(gpus[0], ago + 1, [0] * 6, processes=False)
    else:
        minutes_of(gpus[0], 30, [0] * 6, processes=case == "busy")  # a process on it: not idle
    if case == "just-started":
        Allocation.objects.filter(reservation=reservation).update(starts_at=NOW - timedelta(minutes=10))
    if case == "released":
        Reservation.objects.filter(pk=reservation.pk).update(state="released")

    assert alerts_evaluate(now=NOW)["idle_notified"] == 0
    assert idle_notices(world) == []


def test_a_run_while_another_worker_holds_the_lock_is_skipped(db):
    """Runs are serialised: the minute task finds the previous run (another worker) still going and adds nothing."""
    if connection.vendor != "postgresql":
        pytest.skip("the lease row of SQLite is covered by core.db's own tests")
    held, done = threading.Event(), threading.Event()

    def other_worker():  # its own thread, so its own database session
        lock = LeaderLock("alerts")
        try:
            assert lock.acquire()
            held.set()
            done.wait(30)
            lock.release()
        finally:
            connection.close()

    worker = threading.Thread(target=other_worker)
    worker.start()
    try:
        assert held.wait(30)
        assert alerts_evaluate(now=NOW) == {"skipped": True}
    finally:
        done.set()
        worker.join()
    assert alerts_evaluate(now=NOW)["nodes_judged"] == 0  # the lock is free again
