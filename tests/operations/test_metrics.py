"""
/metrics: who may scrape it (platform tokens or the metrics user; 401/403 otherwise), the fleet
gauges against the rows they count, what the alerting rules need (regions' spares, tenants' queue
and SLA, stuck operations, reference values missing, recent XIDs, the control plane's loops), a
constant number of queries per scrape, request and Celery task metrics, and the multiprocess mode
that carries a worker's task metrics to the web's scrape.
"""

from __future__ import annotations

import base64
import math
import os
import subprocess
import sys
import textwrap
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import time_machine
from celery import shared_task
from django.core.cache import cache
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from cloud.choices import Health, NodeState
from cloud.fleet import FleetSpec, build_fleet
from cloud.models import GPU, GPUSampleRollup, Node, RollupPeriod
from operations import control_metrics
from operations.control_plane import Check, ControlPlaneStatus
from operations.fleet_metrics import SLA_CACHE_KEY, XIDS_CACHE_KEY
from provisioning.models import Allocation, Operation, Reservation, StepRun
from provisioning.scheduling.scheduler import LAST_CYCLE_KEY
from provisioning.sla.accounting import sla_for_tenants
from security.models import AttestationReport, Incident
from tenants.choices import PlatformRole
from tenants.models import APIToken
from tests.world import h100, small_fleet, unique, vm_offering

URL = "/metrics"
NOW = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)


@pytest.fixture(autouse=True)
def control_plane(monkeypatch) -> ControlPlaneStatus:
    """The control plane's state as read() gives it, without a broker to ping."""
    status = ControlPlaneStatus(
        checks={name: Check(True, 1.0) for name in ("database", "cache", "broker", "migrations")},
        scheduler_leader="sched-1:4242", scheduler_last_cycle_age_s=0.4, beat_last_run_age_s=3.5,
        workers=["celery@worker-1", "celery@worker-2"], queue_depths={"meridian": 7})
    monkeypatch.setattr(control_metrics, "read", lambda **_: status)
    return status


def scrape(world, persona="platform_admin", **headers):
    response = world.client(persona).get(URL, **headers)
    assert response.status_code == 200, response.content[:400]
    return response


def samples(response) -> dict[tuple, float]:
    """Every sample as {(name, (label pairs...)): value}."""
    text = response.content.decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(found: dict, name: str, **labels) -> float:
    return found[(name, tuple(sorted(labels.items())))]


#
# Who may scrape
#


def assert_refused(response, status: int, code: str):
    assert response.status_code == status, response.content[:400]
    assert response.json()["errors"][0]["code"] == code
    assert b"meridian_" not in response.content


def test_no_credentials_is_a_401_with_the_challenge(world, api):
    response = api.get(URL)
    assert_refused(response, 401, "not_authenticated")
    assert response["WWW-Authenticate"] == 'Bearer realm="meridian"'


def test_a_tenant_token_is_a_403_whatever_its_role(world):
    for persona in ("t1_viewer", "t1_owner", "t2_member"):
        assert_refused(world.client(persona).get(URL), 403, "permission_denied")


def test_platform_tokens_scrape(world):
    for persona in ("platform_approver", "platform_admin"):
        response = scrape(world, persona)
        assert response["Content-Type"].startswith("text/plain; version=0.0.4")
        assert response["Cache-Control"] == "no-store"
        assert "meridian_nodes" in response.content.decode()


def test_openmetrics_is_served_when_asked_for(world):
    response = scrape(world, HTTP_ACCEPT="application/openmetrics-text; version=1.0.0")
    assert response["Content-Type"].startswith("application/openmetrics-text")
    assert response.content.decode().rstrip().endswith("# EOF")


def test_bad_revoked_and_demoted_tokens_are_401(world, api):
    for header in ("Bearer mrd_", "Bearer " + "x" * 10_000, "Bearer", "Token abc", "Bearer eyJhbGciOi.J9.e30"):
        assert api.get(URL, HTTP_AUTHORIZATION=header).status_code == 401, header
    assert api.get(URL, {"token": world.tokens["platform_admin"]}).status_code == 401  # never from the query

    admin = world.users["platform_approver"]
    admin.platform_role = PlatformRole.NONE
    admin.save()
    assert_refused(world.client("platform_approver").get(URL), 401, "token_revoked")

    APIToken.objects.filter(user=world.users["platform_admin"]).update(revoked_at=timezone.now())
    assert_refused(world.client("platform_admin").get(URL), 401, "token_revoked")


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_the_metrics_user_scrapes_with_basic_auth_when_configured(world, api, settings):
    assert api.get(URL, HTTP_AUTHORIZATION=basic("prometheus", "s3cret")).status_code == 401  # not configured
    settings.MERIDIAN_METRICS_USER, settings.MERIDIAN_METRICS_PASSWORD = "prometheus", "s3cret-long-enough"

    assert api.get(URL, HTTP_AUTHORIZATION=basic("prometheus", "s3cret-long-enough")).status_code == 200
    for header in (basic("prometheus", "wrong"), basic("grafana", "s3cret-long-enough"), "Basic !!!not-base64",
                   "Basic " + base64.b64encode(b"prometheus").decode(), basic("prometheus", "")):
        response = api.get(URL, HTTP_AUTHORIZATION=header)
        assert_refused(response, 401, "not_authenticated")
        assert 'Basic realm="meridian-metrics"' in response["WWW-Authenticate"]


def test_only_get_is_served(world):
    assert world.client("platform_admin").post(URL).status_code == 405


#
# The fleet's figures
#


@pytest.fixture
def fleet(world):
    """A small fleet with a node in maintenance, a failed GPU, 3 GPUs allocated now, a queue, steps, incidents."""
    small_fleet(4)
    nodes = list(Node.objects.order_by("hostname"))
    Node.objects.filter(pk=nodes[0].pk).update(state=NodeState.MAINTENANCE)
    gpus = list(GPU.objects.filter(node=nodes[1]).order_by("index"))
    GPU.objects.filter(pk=gpus[0].pk).update(health=Health.FAILED)
    held = Reservation.objects.create(
        tenant=world.t1.tenant, name="held", offering=vm_offering(), gpu_model=h100(), units=3, gpus=3,
        regions=["us-east-1"], duration=timedelta(hours=2), state="active", starts_at=NOW - timedelta(hours=1),
        ends_at=NOW + timedelta(hours=1), scheduled_at=NOW - timedelta(minutes=30))
    Reservation.objects.filter(pk=held.pk).update(submitted_at=NOW - timedelta(minutes=40))  # waited 10 min
    for gpu in gpus[:3]:
        Allocation.objects.create(reservation=held, gpu=gpu, node=gpu.node, mem_lo=0, mem_hi=gpu.memory_mib,
                                  starts_at=NOW - timedelta(hours=1), ends_at=NOW + timedelta(hours=1))
    for gpu in gpus[3:5]:  # ended: not allocated now
        Allocation.objects.create(reservation=held, gpu=gpu, node=gpu.node, mem_lo=0, mem_hi=gpu.memory_mib,
                                  starts_at=NOW - timedelta(hours=3), ends_at=NOW - timedelta(hours=2))
    queued = []
    for minutes in (60, 20):  # the world's queued reservations are older; their wait is set here too
        queued.append(Reservation.objects.create(
            tenant=world.t2.tenant, name=unique("q"), offering=vm_offering(), gpu_model=h100(), units=1, gpus=1,
            regions=["us-east-1"], duration=timedelta(hours=1), state="queued"))
        Reservation.objects.filter(pk=queued[-1].pk).update(submitted_at=NOW - timedelta(minutes=minutes))
    Reservation.objects.filter(state="queued").exclude(pk__in=[q.pk for q in queued]).update(
        submitted_at=NOW - timedelta(minutes=30))
    operation = Operation.objects.create(tenant=world.t1.tenant, reservation=held, kind="provision")
    for name, seconds, state in [("write_image", 0.3, "succeeded"), ("write_image", 45, "succeeded"),
                                 ("write_image", 700, "failed"), ("boot", 8, "succeeded")]:
        step = StepRun.objects.create(operation=operation, name=name, attempt=1, state=state)
        StepRun.objects.filter(pk=step.pk).update(started_at=NOW - timedelta(minutes=20, seconds=seconds),
                                                  finished_at=NOW - timedelta(minutes=20))
    old = StepRun.objects.create(operation=operation, name="boot", attempt=2, state="succeeded")
    StepRun.objects.filter(pk=old.pk).update(started_at=NOW - timedelta(hours=3), finished_at=NOW - timedelta(hours=2))
    for kind, detected, resolved in [("scrub_unverified", 2, None), ("scrub_unverified", 30, None),
                                     ("fabric_drift", 3, NOW - timedelta(hours=1)), ("fabric_drift", 48, NOW)]:
        made = Incident.objects.create(kind=kind, summary="x", resolved_at=resolved)
        Incident.objects.filter(pk=made.pk).update(detected_at=NOW - timedelta(hours=detected))
    cache.set(LAST_CYCLE_KEY, {"queued": 4, "placed": 1, "conflicts": 0, "over_quota": 1, "waiting": 2,
                               "timings_ms": {"rank": 1.5, "plan": 12.0, "apply": 6.5},
                               "finished_at": (NOW - timedelta(seconds=2)).isoformat()}, None)
    return nodes


def test_fleet_gauges_count_what_the_database_holds(world, fleet):
    with time_machine.travel(NOW, tick=False):
        found = samples(scrape(world))

    assert value(found, "meridian_nodes", state="maintenance", pool=fleet[0].pool) == 1
    assert sum(v for (name, _), v in found.items() if name == "meridian_nodes") == 4
    assert value(found, "meridian_nodes", state="faulty", pool="shared") == 0  # every series, zeros included
    assert value(found, "meridian_gpus", health="failed", state="available") == 1
    assert sum(v for (name, _), v in found.items() if name == "meridian_gpus") == 32
    assert value(found, "meridian_gpus_allocated", model="h100-80gb-sxm") == 3

    queued = Reservation.objects.filter(state="queued").count()
    assert value(found, "meridian_queue_reservations") == queued
    assert value(found, "meridian_queue_wait_seconds", stat="oldest") == 3600
    assert value(found, "meridian_queue_wait_seconds", stat="mean") == pytest.approx(
        (3600 + 1200 + 1800 * (queued - 2)) / queued)
    assert value(found, "meridian_reservations_placed_last_hour") == 1
    assert value(found, "meridian_placement_wait_seconds_last_hour") == 600

    assert value(found, "meridian_scheduler_cycle_seconds") == pytest.approx(0.020)
    assert value(found, "meridian_scheduler_cycle_phase_seconds", phase="plan") == pytest.approx(0.012)
    assert value(found, "meridian_scheduler_cycle_reservations", outcome="waiting") == 2
    assert value(found, "meridian_scheduler_last_cycle_timestamp_seconds") == (NOW - timedelta(seconds=2)).timestamp()

    assert value(found, "meridian_provisioning_steps_last_hour", step="write_image", state="succeeded") == 2
    assert value(found, "meridian_provisioning_steps_last_hour", step="write_image", state="failed") == 1
    assert value(found, "meridian_provisioning_step_duration_seconds_bucket", step="write_image", le="0.5") == 1
    assert value(found, "meridian_provisioning_step_duration_seconds_bucket", step="write_image", le="60.0") == 2
    assert value(found, "meridian_provisioning_step_duration_seconds_bucket", step="write_image", le="+Inf") == 3
    assert value(found, "meridian_provisioning_step_duration_seconds_gsum", step="write_image") == pytest.approx(745.3)
    assert value(found, "meridian_provisioning_step_duration_seconds_gcount", step="boot") == 1  # not the old one

    assert value(found, "meridian_incidents_open", kind="scrub_unverified") == 2
    assert value(found, "meridian_incidents_open", kind="fabric_drift") == 0
    assert value(found, "meridian_incidents_detected_last_day", kind="scrub_unverified") == 1
    assert value(found, "meridian_incidents_detected_last_day", kind="fabric_drift") == 1


def test_an_empty_fleet_scrapes_zeros(world):
    cache.delete(LAST_CYCLE_KEY)
    found = samples(scrape(world))
    assert value(found, "meridian_scheduler_last_cycle_timestamp_seconds") == 0
    assert not [key for key in found if key[0] == "meridian_gpus_allocated"]
    assert value(found, "meridian_nodes", state="available", pool="bare_metal") == 0
    assert value(found, "meridian_queue_wait_seconds", stat="oldest") > 0  # the world's queued reservations


def test_a_scrape_costs_the_same_queries_however_large_the_fleet(world, fleet):
    """
    Warm (the XID and SLA figures cached): the token lookup, seven grouped fleet queries, stuck
    operations and held attestations. Cold adds the XIDs (one) and the SLA (four).
    """
    client = world.client("platform_admin")

    def count(*, cold: bool) -> int:
        if cold:
            cache.delete_many([XIDS_CACHE_KEY, SLA_CACHE_KEY])
        with time_machine.travel(NOW, tick=False), CaptureQueriesContext(connection) as queries:
            assert client.get(URL).status_code == 200
        return len(queries)

    with time_machine.travel(NOW, tick=False):
        client.get(URL)  # the token's last_used_at write happens here
    cold, warm = count(cold=True), count(cold=False)
    build_fleet(FleetSpec(regions=1, nodes_per_fabric=12, first_region=1))  # another region: 12 nodes, 96 GPUs
    operation = Operation.objects.first()
    StepRun.objects.bulk_create([StepRun(operation=operation, name=f"step_{i % 5}", attempt=1, state="succeeded",
                                         finished_at=NOW - timedelta(minutes=5)) for i in range(40)])
    Incident.objects.bulk_create([Incident(kind=f"kind_{i % 7}", summary="x", node_id=n.pk)
                                  for i, n in enumerate(Node.objects.all()[:30])])
    for node in Node.objects.all()[:5]:
        held_for_references(node)
        xids(node, 2)
    assert (count(cold=True), count(cold=False)) == (cold, warm)
    assert (cold, warm) == (15, 10)


#
# What the alerting rules need
#


def held_for_references(node, *, vbios="96.00.99.00.01", driver="550.54.15"):
    """Hold ``node`` in reference_unavailable with a verdict that says its GPUs' firmware has no reference values."""
    Node.objects.filter(pk=node.pk).update(state=NodeState.REFERENCE_UNAVAILABLE)
    gpus = list(GPU.objects.filter(node=node).select_related("model").order_by("index"))
    summaries = [{"uuid": g.uuid, "serial": g.serial, "model": g.model.slug, "vbios": vbios, "driver": driver}
                 for g in gpus]
    return AttestationReport.objects.create(
        node_id=node.pk, nonce="n", status="reference_unavailable", gpus=summaries,
        reasons=[{"gpu": g.uuid, "check": "reference_missing", "detail": "no reference measurements"} for g in gpus])


def xids(node, n: int, *, minutes_ago: int = 3):
    gpu = GPU.objects.filter(node=node).order_by("index").first()
    GPUSampleRollup.objects.create(gpu=gpu, period=RollupPeriod.MINUTE, samples=6, xid_count=n,
                                   bucket=NOW - timedelta(minutes=minutes_ago))


def test_regions_count_their_nodes_and_ready_spares(world, fleet):
    Node.objects.filter(pk__in=[fleet[0].pk, fleet[1].pk]).update(is_spare=True)  # one in maintenance, one ready
    nodes = Node.objects.all()
    ready = nodes.filter(is_spare=True, state__in=["available", "in_service"], health__in=["healthy", "degraded"])
    assert ready.count() == 1
    with time_machine.travel(NOW, tick=False):
        found = samples(scrape(world))
    region = fleet[0].region.slug
    assert sum(v for (name, labels), v in found.items()
               if name == "meridian_region_nodes" and ("region", region) in labels) == nodes.count()
    assert value(found, "meridian_region_nodes", region=region, state="maintenance") == 1
    assert value(found, "meridian_region_nodes", region=region, state="faulty") == 0
    assert value(found, "meridian_region_spare_nodes", region=region) == ready.count()

    ready.update(state=NodeState.SUSPECT)  # a spare that is not ready does not count
    with time_machine.travel(NOW, tick=False):
        assert value(samples(scrape(world)), "meridian_region_spare_nodes", region=region) == 0


def test_tenants_gpus_and_queue(world, fleet):
    with time_machine.travel(NOW, tick=False):
        found = samples(scrape(world))
    t1, t2 = world.t1.tenant, world.t2.tenant
    assert value(found, "meridian_tenant_gpus_allocated", tenant=t1.slug) == 3
    assert ("meridian_tenant_gpus_allocated", (("tenant", t2.slug),)) not in found
    queued = Reservation.objects.filter(tenant=t2, state="queued")
    assert value(found, "meridian_tenant_queue_reservations", tenant=t2.slug) == queued.count()
    assert value(found, "meridian_tenant_queue_wait_seconds", tenant=t2.slug, stat="oldest") == 3600
    assert sum(v for (name, _), v in found.items()
               if name == "meridian_tenant_queue_reservations") == value(found, "meridian_queue_reservations")


def test_open_incidents_by_node(world, fleet):
    node = fleet[2]
    for _ in range(2):
        Incident.objects.create(kind="utilization_fluctuation", node_id=node.pk, summary="x")
    Incident.objects.create(kind="repeated_xids_node", node_id=node.pk, summary="x", resolved_at=NOW)
    with time_machine.travel(NOW, tick=False):
        found = samples(scrape(world))
    assert value(found, "meridian_node_incidents_open", kind="utilization_fluctuation", node=node.hostname) == 2
    assert ("meridian_node_incidents_open", (("kind", "repeated_xids_node"), ("node", node.hostname))) not in found
    assert value(found, "meridian_incidents_open", kind="utilization_fluctuation") == 2
    assert value(found, "meridian_incidents_detected_last_day", kind="repeated_xids_node") == 1


def test_operations_stuck_past_their_deadline(world, fleet, settings):
    operation = Operation.objects.get(kind="provision")
    with time_machine.travel(NOW, tick=False):
        found = samples(scrape(world))
    assert value(found, "meridian_operations_unfinished", kind="provision") == 1
    assert value(found, "meridian_operations_stuck", kind="provision") == 0
    assert value(found, "meridian_operations_stuck", kind="attest") == 0  # every kind, zeros included

    stalled = NOW - settings.MERIDIAN_STUCK_AFTER - timedelta(seconds=1)
    Operation.objects.filter(pk=operation.pk).update(updated_at=stalled)
    with time_machine.travel(NOW, tick=False):
        assert value(samples(scrape(world)), "meridian_operations_stuck", kind="provision") == 1


def test_gpus_waiting_for_reference_values_by_firmware(world, fleet):
    node = next(n for n in fleet if n.state == NodeState.AVAILABLE)
    AttestationReport.objects.filter(pk=held_for_references(node, vbios="96.00.11.00.01").pk).update(
        verified_at=NOW - timedelta(hours=1))  # an older verdict: only the latest counts
    held_for_references(node)
    released = next(n for n in fleet if n.state == NodeState.AVAILABLE and n.pk != node.pk)
    held_for_references(released)
    Node.objects.filter(pk=released.pk).update(state=NodeState.AVAILABLE)  # references came: not held any more
    with time_machine.travel(NOW, tick=False):
        found = samples(scrape(world))
    model = GPU.objects.filter(node=node).first().model.slug
    assert value(found, "meridian_attestation_references_missing", model=model, vbios="96.00.99.00.01",
                 driver="550.54.15") == GPU.objects.filter(node=node).count()
    assert [key for key in found if key[0] == "meridian_attestation_references_missing"] == [
        ("meridian_attestation_references_missing",
         (("driver", "550.54.15"), ("model", model), ("vbios", "96.00.99.00.01")))]


def test_recent_xids_by_node_read_once_a_minute(world, fleet):
    node = fleet[1]
    xids(node, 2)
    xids(node, 1, minutes_ago=1)
    xids(node, 9, minutes_ago=30)  # outside the window
    with time_machine.travel(NOW, tick=False):
        found = samples(scrape(world))
    assert value(found, "meridian_node_xids_recent", node=node.hostname, region=node.region.slug) == 3
    assert len([key for key in found if key[0] == "meridian_node_xids_recent"]) == 1

    xids(fleet[3], 5)
    with time_machine.travel(NOW, tick=False):
        assert len([k for k in samples(scrape(world)) if k[0] == "meridian_node_xids_recent"]) == 1  # cached
    cache.delete(XIDS_CACHE_KEY)
    with time_machine.travel(NOW, tick=False):
        assert value(samples(scrape(world)), "meridian_node_xids_recent", node=fleet[3].hostname,
                     region=fleet[3].region.slug) == 5


def test_sla_availability_by_tenant(world, fleet, settings):
    settings.MERIDIAN_SLA_TARGET = 99.5
    held = Reservation.objects.get(name="held")
    gpu = Allocation.objects.filter(reservation=held).first().gpu
    Incident.objects.create(kind="gpu_failure", summary="x", tenant_id=held.tenant_id, reservation_id=held.pk,
                            gpu_ids=[str(gpu.pk)], gpus_affected=1, impact_started_at=NOW - timedelta(minutes=30))
    with time_machine.travel(NOW, tick=False):
        found = samples(scrape(world))
        expected = sla_for_tenants(Reservation.objects.all(), tenant_ids=[held.tenant_id],
                                   month=NOW.date().replace(day=1), now=NOW)[held.tenant_id]
    assert value(found, "meridian_sla_target_percent") == 99.5
    availability = value(found, "meridian_tenant_sla_availability_percent", tenant=world.t1.tenant.slug)
    assert availability == pytest.approx(float(expected.availability)) and availability < 99.5


def test_control_plane_gauges(world, control_plane):
    found = samples(scrape(world))
    assert value(found, "meridian_control_plane_check", check="read") == 1
    assert value(found, "meridian_control_plane_check", check="broker") == 1
    assert value(found, "meridian_migrations_pending") == 0
    assert value(found, "meridian_scheduler_last_cycle_age_seconds") == 0.4
    assert value(found, "meridian_scheduler_leader", leader="sched-1:4242") == 1
    assert value(found, "meridian_beat_last_run_age_seconds") == 3.5
    assert value(found, "meridian_celery_workers") == 2
    assert value(found, "meridian_broker_queue_messages", queue="meridian") == 7
    assert value(found, "meridian_scheduler_cycle_budget_seconds") == 0.25

    control_plane.scheduler_last_cycle_age_s = control_plane.beat_last_run_age_s = control_plane.scheduler_leader = None
    control_plane.workers, control_plane.checks["broker"] = [], Check(False, 2000.0, "OSError: refused")
    found = samples(scrape(world))
    assert value(found, "meridian_scheduler_last_cycle_age_seconds") == math.inf  # never: as old as can be
    assert value(found, "meridian_beat_last_run_age_seconds") == math.inf
    assert value(found, "meridian_celery_workers") == 0
    assert value(found, "meridian_control_plane_check", check="broker") == 0
    assert not [key for key in found if key[0] == "meridian_scheduler_leader"]


def test_a_control_plane_that_cannot_be_read_leaves_the_rest_of_the_scrape(world, monkeypatch):
    def lost(**_):
        raise ConnectionError("broker lost")

    monkeypatch.setattr(control_metrics, "read", lost)
    found = samples(scrape(world))
    assert value(found, "meridian_control_plane_check", check="read") == 0
    assert not [key for key in found if key[0] == "meridian_celery_workers"]
    assert value(found, "meridian_nodes", state="available", pool="shared") == 0


#
# The control plane's own request and task metrics
#


def test_requests_are_counted_by_view_and_status(world):
    world.client("t1_member").get("/api/v1/reservations/")
    world.client("anon").get("/api/v1/reservations/")
    found = samples(scrape(world))
    assert value(found, "django_http_responses_total_by_status_view_method_total", status="200",
                 view="reservations-list", method="GET") >= 1
    assert value(found, "django_http_responses_total_by_status_view_method_total", status="401",
                 view="reservations-list", method="GET") >= 1


@shared_task(name="tests.metrics_boom")
def boom():
    raise RuntimeError("boom")


def test_celery_tasks_are_counted_by_name_and_outcome(world):
    from operations.tasks import alerts_evaluate

    before = samples(scrape(world))
    alerts_evaluate.apply()
    boom.apply()
    after = samples(scrape(world))

    def delta(name, **labels):
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0) - before.get(key, 0)

    assert delta("meridian_celery_tasks_total", task="cloud.alerts_evaluate", state="succeeded") == 1
    assert delta("meridian_celery_tasks_total", task="tests.metrics_boom", state="failed") == 1
    assert delta("meridian_celery_task_duration_seconds_count", task="cloud.alerts_evaluate") == 1


WORKER = textwrap.dedent("""
    import django
    django.setup()
    from celery import signals
    import operations.tasks  # what a worker loads: it connects the task metrics
    class Task:
        name = "provisioning.operation_step"
    task = Task()
    for i in range(3):
        signals.task_prerun.send(sender=task, task_id=str(i), task=task)
        signals.task_postrun.send(sender=task, task_id=str(i), task=task, state="SUCCESS")
""")


def test_a_workers_task_metrics_reach_the_scrape_in_multiprocess_mode(world, tmp_path, monkeypatch):
    """A worker process writes its metrics to PROMETHEUS_MULTIPROC_DIR; the web's scrape reads them from there."""
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path), "DJANGO_SETTINGS_MODULE": "tests.settings"}
    subprocess.run([sys.executable, "-c", WORKER], env=env, check=True, timeout=120,
                   cwd=Path(__file__).resolve().parents[2])
    assert list(tmp_path.glob("*.db")), "the worker wrote no metric files"

    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    found = samples(scrape(world))

    assert value(found, "meridian_celery_tasks_total", task="provisioning.operation_step", state="succeeded") == 3
    assert value(found, "meridian_nodes", state="available", pool="shared") == 0  # the fleet is still there
