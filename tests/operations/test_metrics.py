"""
/metrics: who may scrape it (platform tokens or the metrics user; 401/403 otherwise), the fleet
gauges against the rows they count, a constant number of queries per scrape, request and Celery
task metrics, and the multiprocess mode that carries a worker's task metrics to the web's scrape.
"""

from __future__ import annotations

import base64
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
from cloud.models import GPU, Node
from provisioning.models import Allocation, Operation, Reservation, StepRun
from provisioning.scheduling.scheduler import LAST_CYCLE_KEY
from security.models import Incident
from tenants.choices import PlatformRole
from tenants.models import APIToken
from tests.world import h100, small_fleet, unique, vm_offering

URL = "/metrics"
NOW = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)


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
    client = world.client("platform_admin")

    def count() -> int:
        with time_machine.travel(NOW, tick=False), CaptureQueriesContext(connection) as queries:
            assert client.get(URL).status_code == 200
        return len(queries)

    with time_machine.travel(NOW, tick=False):
        client.get(URL)  # the token's last_used_at write happens here
    few = count()
    build_fleet(FleetSpec(regions=1, nodes_per_fabric=12, first_region=1))  # another region: 12 nodes, 96 GPUs
    operation = Operation.objects.first()
    StepRun.objects.bulk_create([StepRun(operation=operation, name=f"step_{i % 5}", attempt=1, state="succeeded",
                                         finished_at=NOW - timedelta(minutes=5)) for i in range(40)])
    Incident.objects.bulk_create([Incident(kind=f"kind_{i % 7}", summary="x") for i in range(30)])
    assert count() == few
    assert few == 7  # the token lookup and six grouped queries


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
