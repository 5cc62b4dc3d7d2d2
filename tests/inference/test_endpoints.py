"""
Endpoints end to end on the simulated fleet: replicas are reservations that serve once active and
healthy, behind an HAProxy configuration HAProxy itself accepts; scale out and in on utilization
(draining before release), burst to the next region and come back, replace a replica whose node
failed (out of the balancer from detection on); bad input is a 400 that leaves nothing behind.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.utils import timezone

from cloud.models import GPUSample
from inference import balancer, replicas, scaling
from inference.models import BalancerState, Endpoint, Replica, ScalingDecision
from provisioning.lifecycle.no_shows import no_show_scan
from provisioning.lifecycle.replacement import node_failed
from provisioning.models import Allocation, Instance, Reservation
from provisioning.scheduling.scheduler import run_cycle
from tenants.choices import QuotaResource
from tenants.models import Event, Quota
from tests.inference.helpers import body, fill, replica_gpus, sample, time_sliced, two_regions, whole_gpu_container
from webhooks.models import WebhookEndpoint


@pytest.fixture
def fleet(world, settings, tmp_path):
    settings.MERIDIAN_BALANCER_CONFIG = str(tmp_path / "haproxy.cfg")
    settings.MERIDIAN_ENDPOINT_PROBE = "simulated"
    settings.MERIDIAN_ENDPOINT_DRAIN_SECONDS = 0
    two_regions()
    whole_gpu_container()
    return world


def create(world, persona="t1_member", **overrides) -> Endpoint:
    response = world.client(persona).post("/api/v1/endpoints/", body(**overrides), format="json")
    assert response.status_code == 201, response.json()
    return Endpoint.objects.get(pk=response.json()["id"])


def settle(endpoint: Endpoint, steps) -> Endpoint:
    """Start what is missing, provision what was placed, converge and write the balancer (beat passes, in process)."""
    replicas.converge(endpoint.pk)
    steps.run()
    replicas.converge(endpoint.pk)
    balancer.sync()
    replicas.converge(endpoint.pk)
    endpoint.refresh_from_db()
    return endpoint


def serving(endpoint: Endpoint) -> list[Replica]:
    return list(endpoint.replicas.filter(state="serving").select_related("reservation__region"))


def test_an_endpoint_serves_its_minimum_behind_a_balancer_haproxy_accepts(fleet, steps):
    time_sliced("realtime", 4)
    endpoint = settle(create(fleet, min_replicas=2, share={"gpu_model": "h100-80gb-sxm", "kind": "time_slice",
                                                             "fraction": 4, "time_slice_class": "realtime"}), steps)
    assert endpoint.offering == time_sliced("realtime", 4)
    live = serving(endpoint)
    assert len(live) == 2
    assert all(r.reservation.managed_by == f"endpoint:{endpoint.pk}" for r in live)
    config = config_text()
    for replica in live:
        ip = Instance.objects.get(reservation=replica.reservation).private_ip
        assert f"{ip}:8000 check" in config
    assert "option httpchk GET /healthz" in config and f"chat--{endpoint.tenant.slug}" in config
    shown = fleet.client("t1_member").get(f"/api/v1/endpoints/{endpoint.pk}/").json()
    assert shown["url"].startswith("https://chat--") and shown["replicas"] == {"serving": 2}


def config_text() -> str:
    return Path(settings.MERIDIAN_BALANCER_CONFIG).read_text()


def test_haproxy_itself_accepts_the_configuration_and_refuses_a_broken_one(fleet, steps, haproxy):
    time_sliced("realtime", 4)
    settle(create(fleet, min_replicas=2), steps)
    config = config_text()
    assert balancer.validate(config) == ""
    assert "unknown keyword 'nonsense'" in balancer.validate(config + "\nbackend broken\n    nonsense here\n")


def test_a_load_step_scales_out_and_a_quiet_spell_scales_in_draining_first(fleet, steps):
    endpoint = settle(create(fleet, min_replicas=1, max_replicas=3, scale_in_stabilization_seconds=0,
                             scale_in_cooldown_seconds=0, scale_out_cooldown_seconds=0), steps)
    sample(replica_gpus(endpoint), 95)
    decision = scaling.autoscale(endpoint.pk)
    assert decision.action == "scale_out" and decision.replicas_after == 2
    assert decision.inputs["utilization"] == 95.0 and decision.inputs["serving"] == 1
    endpoint = settle(endpoint, steps)
    assert len(serving(endpoint)) == 2
    sample(replica_gpus(endpoint), 10, ago_s=0.5)
    decision = scaling.autoscale(endpoint.pk, now=timezone.now() + timedelta(seconds=1))
    assert decision.action == "scale_in" and decision.replicas_after == 1
    draining = endpoint.replicas.get(state="draining")
    assert draining.reservation.state == "active"  # not released before the balancer lost it
    state = balancer.sync()
    assert f"r{draining.pk.hex[:12]}" not in config_text()
    assert state.checked_at > draining.draining_since
    replicas.converge(endpoint.pk)
    draining.refresh_from_db()
    assert draining.state == "gone" and Reservation.objects.get(pk=draining.reservation_id).state in (
        "releasing", "released")


def test_decisions_are_recorded_with_their_inputs_and_shown(fleet, steps):
    endpoint = settle(create(fleet), steps)
    sample(replica_gpus(endpoint), 90)
    scaling.autoscale(endpoint.pk)
    shown = fleet.client("t1_viewer").get(f"/api/v1/endpoints/{endpoint.pk}/decisions/").json()
    assert shown[0]["action"] == "scale_out" and "over the 70% target" in shown[0]["reason"]
    assert shown[0]["inputs"]["window_seconds"] == 10


def test_a_hot_home_region_bursts_new_replicas_to_the_next_and_they_come_back(fleet, steps):
    endpoint = settle(create(fleet, regions=["us-east-1", "eu-north-1"], burst_after_seconds=0,
                             scale_out_cooldown_seconds=0), steps)
    hogged = fill(fleet, "us-east-1", 0.9)  # the home region at 90 %, above the 85 % mark
    sample(replica_gpus(endpoint), 95)
    scaling.autoscale(endpoint.pk)  # hot: the mark is crossed now
    scaling.autoscale(endpoint.pk)  # hot for burst_after_seconds (0): burst
    assert ScalingDecision.objects.filter(endpoint=endpoint, action="burst").exists()
    endpoint = settle(endpoint, steps)
    burst = list(endpoint.replicas.filter(burst=True).select_related("reservation__region"))
    assert burst and all(r.reservation.region.slug == "eu-north-1" and r.state == "serving" for r in burst)
    Reservation.objects.filter(allocations__gpu__in=hogged).update(state="released")
    Allocation.objects.filter(gpu__in=hogged).update(ends_at=timezone.now())
    GPUSample.objects.all().delete()
    sample(replica_gpus(endpoint), 50)  # inside the band: the count holds, only the place changes
    scaling.autoscale(endpoint.pk)
    assert ScalingDecision.objects.filter(endpoint=endpoint, action="return").exists()
    endpoint = settle(endpoint, steps)  # a home replica starts and serves ...
    for _ in range(2):  # ... then the burst ones drain, and go once the balancer lost them
        balancer.sync()
        replicas.converge(endpoint.pk)
    assert not endpoint.replicas.filter(burst=True).exclude(state="gone").exists()
    assert {r.reservation.region.slug for r in serving(endpoint)} == {"us-east-1"}


def test_a_replica_waiting_at_a_full_home_starts_over_in_the_burst_region(fleet, steps):
    endpoint = settle(create(fleet, regions=["us-east-1", "eu-north-1"], burst_after_seconds=0,
                             scale_out_cooldown_seconds=0), steps)
    fill(fleet, "us-east-1", 1.0)
    Endpoint.objects.filter(pk=endpoint.pk).update(desired_replicas=2)
    endpoint = settle(endpoint, steps)
    waiting = endpoint.replicas.get(state="starting")
    assert waiting.reservation.state == "queued" and not waiting.burst
    scaling.autoscale(endpoint.pk)  # hot now (the mark is crossed) ...
    scaling.autoscale(endpoint.pk)  # ... for burst_after_seconds: burst
    endpoint = settle(endpoint, steps)
    waiting.refresh_from_db()
    assert waiting.state in ("draining", "gone")
    balancer.sync()
    replicas.converge(endpoint.pk)
    waiting.refresh_from_db()
    assert waiting.state == "gone" and Reservation.objects.get(pk=waiting.reservation_id).state == "cancelled"
    assert [r.reservation.region.slug for r in serving(endpoint) if r.burst] == ["eu-north-1"]


def test_bursting_never_takes_the_next_regions_on_demand_headroom(fleet, steps):
    endpoint = settle(create(fleet, regions=["us-east-1", "eu-north-1"], burst_after_seconds=0), steps)
    fill(fleet, "us-east-1", 0.9)
    fill(fleet, "eu-north-1", 0.95)  # inside its 10 % headroom already
    scaling.autoscale(endpoint.pk)
    scaling.autoscale(endpoint.pk)
    endpoint.refresh_from_db()
    assert not endpoint.bursting
    assert not ScalingDecision.objects.filter(endpoint=endpoint, action="burst").exists()


def test_a_replica_whose_node_failed_leaves_the_balancer_and_is_replaced(fleet, steps):
    endpoint = settle(create(fleet, min_replicas=2), steps)
    victim = serving(endpoint)[0]
    node = Instance.objects.get(reservation=victim.reservation).node
    ip = Instance.objects.get(reservation=victim.reservation).private_ip
    node_failed(node=node, cause="test", summary="power lost", evidence={}, impact_started_at=timezone.now())
    balancer.sync()  # the change asked for a write; here it runs in process
    assert f"{ip}:8000" not in config_text()
    endpoint = settle(endpoint, steps)
    assert len(serving(endpoint)) == 2
    assert all(Instance.objects.filter(reservation=r.reservation, state="active").exclude(node=node).exists()
               for r in serving(endpoint))


def test_a_replica_near_its_reservations_end_is_replaced_before_it_ends(fleet, steps):
    endpoint = settle(create(fleet), steps)
    old = serving(endpoint)[0]
    Reservation.objects.filter(pk=old.reservation_id).update(ends_at=timezone.now() + timedelta(minutes=30))
    endpoint = settle(endpoint, steps)  # a new one starts and serves; then the old one drains
    old.refresh_from_db()
    assert old.state in ("draining", "gone") and len(serving(endpoint)) == 1
    assert old.draining_since > serving(endpoint)[0].serving_since  # the new one served first
    balancer.sync()
    replicas.converge(endpoint.pk)
    old.refresh_from_db()
    assert old.state == "gone" and serving(endpoint)[0].pk != old.pk


def test_an_endpoint_in_a_region_without_capacity_waits_with_the_reason(fleet, steps):
    fill(fleet, "us-east-1", 1.0)
    endpoint = settle(create(fleet), steps)
    waiting = endpoint.replicas.get()
    assert waiting.state == "starting" and waiting.reservation.state == "queued"
    run_cycle()  # the scheduler says why it waits
    replicas.converge(endpoint.pk)
    shown = fleet.client("t1_member").get(f"/api/v1/endpoints/{endpoint.pk}/replicas/").json()
    assert shown[0]["state"] == "starting" and shown[0]["state_reason"].startswith("waiting:")
    assert "us-east-1" in shown[0]["state_reason"], shown[0]["state_reason"]


def test_a_replica_the_quota_refuses_is_said_once_not_on_every_pass(fleet, steps):
    Quota.objects.update_or_create(tenant=fleet.t1.tenant, team=None, resource=QuotaResource.GPUS,
                                   defaults={"limit": 0})
    endpoint = create(fleet)
    for _ in range(3):
        replicas.converge(endpoint.pk)
    (held,) = ScalingDecision.objects.filter(endpoint=endpoint)
    assert held.action == "hold" and "a new replica was refused" in held.reason and "quota" in held.reason.lower()
    assert not endpoint.replicas.exists() and not Reservation.objects.filter(managed_by__startswith="endpoint").exists()


def test_deleting_drains_and_releases_every_replica(fleet, steps):
    endpoint = settle(create(fleet, min_replicas=2), steps)
    response = fleet.client("t1_member").delete(f"/api/v1/endpoints/{endpoint.pk}/")
    assert response.status_code == 202
    replicas.converge(endpoint.pk)  # drained (after the delete's commit, in a deployment)
    balancer.sync()
    replicas.converge(endpoint.pk)  # released
    endpoint.refresh_from_db()
    assert endpoint.state == "deleted" and not endpoint.replicas.exclude(state="gone").exists()
    assert BalancerState.objects.get().checked_at is not None


@pytest.mark.parametrize("change, field, code", [
    ({"min_replicas": 5, "max_replicas": 2}, "min_replicas", "min_over_max"),
    ({"min_replicas": 0}, "min_replicas", "min_value"),
    ({"share": {"gpu_model": "h100-80gb-sxm", "kind": "mig", "fraction": 7, "time_slice_class": "realtime"}},
     "share", "class_without_time_slice"),
    ({"share": {"gpu_model": "h100-80gb-sxm", "kind": "time_slice", "fraction": 9, "time_slice_class": "batch"}},
     "share", "too_many_tasks"),
    ({"share": {"gpu_model": "h100-80gb-sxm", "kind": "slot", "fraction": 3}}, "share", "share_not_sold"),
    ({"share": {"gpu_model": "a100-80gb-sxm"}}, "share", "share_not_sold"),
    ({"regions": ["mars-1"]}, "regions", "does_not_exist"),
    ({"health_path": "http://10.0.0.1/healthz"}, "health_path", "health_check_outside"),
    ({"health_path": "//evil.example/x"}, "health_path", "health_check_outside"),
    ({"scale_in_below": 80, "target_utilization": 70}, "scale_in_below", "invalid"),
])
def test_bad_input_is_a_400_that_leaves_nothing(fleet, change, field, code):
    response = fleet.client("t1_member").post("/api/v1/endpoints/", body(**change), format="json")
    assert response.status_code == 400, response.json()
    (error,) = response.json()["errors"]
    assert (error["code"], error["attr"]) == (code, field), error
    assert not Endpoint.objects.exists() and not Reservation.objects.filter(managed_by__startswith="endpoint").exists()


def test_two_creates_racing_for_a_name_make_one_endpoint_and_a_409(fleet, monkeypatch):
    """The check before the insert is passed by both; the name constraint decides, as a 409, not a 500."""
    first = fleet.client("t1_member").post("/api/v1/endpoints/", body(), format="json")
    assert first.status_code == 201
    monkeypatch.setattr(Endpoint.objects, "filter", lambda **kw: Endpoint.objects.none())  # it looked first too
    second = fleet.client("t1_owner").post("/api/v1/endpoints/", body(), format="json")
    assert second.status_code == 409 and second.json()["errors"][0]["code"] == "name_taken"
    assert Endpoint.objects.all().count() == 1


def test_another_tenant_sees_nothing_of_an_endpoint(fleet, steps):
    endpoint = settle(create(fleet), steps)
    other = fleet.client("t2_owner")
    base = f"/api/v1/endpoints/{endpoint.pk}/"
    for path in ("", "replicas/", "decisions/", "utilization/"):
        assert other.get(base + path).status_code == 404
    assert other.patch(base, {"max_replicas": 9}, format="json").status_code == 404
    assert other.delete(base).status_code == 404
    assert other.get("/api/v1/endpoints/").json()["results"] == []


def test_an_idle_replica_is_never_released_as_a_no_show(fleet, steps):
    endpoint = settle(create(fleet), steps)
    later = timezone.now() + timedelta(hours=2)
    report = no_show_scan(now=later)
    assert report["warned"] == 0 and report["no_shows"] == 0
    assert serving(endpoint)[0].reservation.state == "active"


def test_the_tenants_webhooks_hear_of_each_decision(fleet, steps):
    WebhookEndpoint.objects.create(tenant=fleet.t1.tenant, url="http://127.0.0.1:9/hooks", event_types=["endpoint.*"],
                                   secret="whsec_test")
    endpoint = settle(create(fleet), steps)
    sample(replica_gpus(endpoint), 95)
    scaling.autoscale(endpoint.pk)
    event = Event.objects.get(type="endpoint.scale_out")
    assert event.tenant_id == fleet.t1.tenant.pk and event.data["replicas_after"] == 2
    assert not Event.objects.filter(type__startswith="endpoint.").exclude(tenant=fleet.t1.tenant).exists()
