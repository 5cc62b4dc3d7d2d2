"""
No-shows and late releases (provisioning.lifecycle.no_shows): an active reservation idle for its offering's
grace is warned with the evidence, then released as a no-show (counted against the team's record)
unless its GPUs are used meanwhile; no telemetry is no evidence; GPUs held past the end plus the
release grace are reclaimed, the delay recorded. Telemetry rows are written straight to the tables.
"""

from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from cloud.models import GPU, GPUModel, GPUSampleRollup, GPUTelemetry, NodeBMCReading, Offering
from provisioning.high_priority import services as hp
from provisioning.lifecycle import no_shows as no_shows
from provisioning.lifecycle.no_shows import IDLE, UNKNOWN, USED, Latest, Minutes, gpu_verdict, no_show_scan
from provisioning.models import Allocation, Instance, Operation, Reservation
from provisioning.scheduling.team_record import team_inputs
from provisioning.services import reservation_rescore, weights
from security.models import AuditEvent
from tenants.models import HighPriorityApplication, Notification
from tests.provisioning.factories import make_reservation
from tests.provisioning.pipeline import SSH_KEY
from tests.world import small_fleet, team_record, vm_offering

URL = "/api/v1/reservations/"


@pytest.fixture
def fleet(world):
    Reservation.objects.all().delete()  # the world's own queued work would compete
    HighPriorityApplication.objects.all().delete()
    return small_fleet(4)


def active(world, steps, *, offering=None, **amount) -> Reservation:
    """An active reservation of t1's team (a VM on 2 GPUs by default), through the API and the lifecycle."""
    chosen = offering or vm_offering(2)
    amount = amount or {"gpus": 2}
    response = world.client("t1_member").post(URL, {
        "name": "job", "offering": chosen.slug, "regions": ["us-east-1"], "duration_hours": 2,
        "ssh_public_key": SSH_KEY, "team": str(world.t1.team.pk), **amount}, format="json")
    assert response.status_code == 201, response.json()
    steps.run()
    reservation = Reservation.objects.get(pk=response.json()["id"])
    assert reservation.state == "active"
    return reservation


def gpus_of(reservation) -> list[GPU]:
    return list(GPU.objects.filter(allocations__reservation=reservation).distinct())


def telemetry(reservation, *, start, end, busy_from=None, latest_busy=False) -> None:
    """
    Per GPU of ``reservation``: 1-minute rollups for ``[start, end)`` (6 samples each, idle, busy
    from ``busy_from``) and a latest sample just before ``end``.
    """
    minute = start.replace(second=0, microsecond=0) + timedelta(minutes=1)
    rows = []
    for gpu in gpus_of(reservation):
        at = minute
        while at < end:
            busy = busy_from is not None and at >= busy_from
            rows.append(GPUSampleRollup(gpu=gpu, period="1m", bucket=at, samples=6, utilization_samples=6,
                                        utilization_sum=480 if busy else 0, utilization_max=80 if busy else 0,
                                        idle_samples=0 if busy else 6))
            at += timedelta(minutes=1)
        GPUTelemetry.objects.update_or_create(gpu=gpu, defaults={
            "node_id": gpu.node_id, "sampled_at": end - timedelta(seconds=20), "source": "agent",
            "utilization_pct": 90 if latest_busy else 0, "processes": 1 if latest_busy else 0, "power_w": 90.0})
    GPUSampleRollup.objects.bulk_create(rows, ignore_conflicts=True)


def events(reservation, action) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(action=action, target_id=str(reservation.pk)))


def notices(reservation, kind) -> list[Notification]:
    return list(Notification.objects.filter(kind=kind, link=f"/reservations/{reservation.pk}/"))


#
# No-shows
#


def test_idle_reservation_is_warned_with_evidence_then_released_as_a_no_show(world, fleet, steps):
    """Idle for the grace: warned once (notification, audit, the usage API); idle still after the warning: no_show."""
    team = world.t1.team
    team_record(team, used=10)
    reservation = active(world, steps)
    t0 = reservation.state_changed_at
    assert hp.hp_assess(team)["eligible"] is True
    record = team_inputs(tenant=reservation.tenant_id, team=team.pk, gpu_model_id=reservation.gpu_model_id,
                         now=timezone.now(), weights=weights())
    assert record.fulfilment_rate == 1.0

    telemetry(reservation, start=t0, end=t0 + timedelta(minutes=14))
    assert no_show_scan(now=t0 + timedelta(minutes=14))["warned"] == 0  # inside the grace

    telemetry(reservation, start=t0, end=t0 + timedelta(minutes=16))
    assert no_show_scan(now=t0 + timedelta(minutes=16))["warned"] == 1
    (warning,) = events(reservation, no_shows.WARNING)
    assert warning.after["evidence"]["verdict"] == IDLE
    assert len(warning.after["evidence"]["gpus"]) == 2
    assert {g["idle_fraction"] for g in warning.after["evidence"]["gpus"]} == {1.0}
    (notice,) = notices(reservation, no_shows.WARNING)
    assert notice.team_id == team.pk and "no-show" in notice.title and "0 % utilization" in notice.body

    body = world.client("t1_member").get(f"{URL}{reservation.pk}/usage/").json()
    assert body["warning"]["status"] == "pending"
    assert body["warning"]["evidence"]["verdict"] == IDLE
    assert body["policy"] == {"no_show_grace_minutes": 15, "no_show_warning_minutes": 10,
                              "release_grace_minutes": 10}

    # Run again (twice) before the warning period is over: nothing more.
    assert no_show_scan(now=t0 + timedelta(minutes=17)) == {"warned": 0, "cleared": 0, "no_shows": 0,
                                                            "reclaimed": 0, "errors": 0}
    assert no_show_scan(now=t0 + timedelta(minutes=17))["warned"] == 0
    assert len(events(reservation, no_shows.WARNING)) == 1 and len(notices(reservation, no_shows.WARNING)) == 1

    telemetry(reservation, start=t0, end=t0 + timedelta(minutes=27))
    assert no_show_scan(now=t0 + timedelta(minutes=27))["no_shows"] == 1
    reservation.refresh_from_db()
    assert reservation.state == "no_show" and reservation.released_at is not None
    assert not Allocation.objects.filter(reservation=reservation, ends_at__gt=timezone.now()).exists()
    (released,) = events(reservation, no_shows.NO_SHOW)
    assert released.after["evidence"]["verdict"] == IDLE
    assert notices(reservation, no_shows.NO_SHOW)

    # The GPUs are cleaned like any release; the reservation stays a no-show.
    steps.run()
    reservation.refresh_from_db()
    assert reservation.state == "no_show"
    assert Operation.objects.get(reservation=reservation, kind="release").state == "succeeded"
    assert set(Instance.objects.filter(reservation=reservation).values_list("state", flat=True)) == {"released"}
    assert {g.state for g in gpus_of(reservation)} == {"available"}
    assert world.client("t1_member").get(f"{URL}{reservation.pk}/usage/").json()["warning"]["status"] == "released"

    # The team's record: fulfilment drops, and with it the score and the high-priority eligibility.
    record = team_inputs(tenant=reservation.tenant_id, team=team.pk, gpu_model_id=reservation.gpu_model_id,
                         now=timezone.now(), weights=weights())
    assert record.fulfilment_rate == pytest.approx(10 / 11)
    assessed = hp.hp_assess(team)
    assert assessed["eligible"] is False and "fulfilment" in assessed["reasons"][0]


def test_no_show_lowers_the_score_of_the_teams_queued_work(world, fleet, steps):
    """A no-show lowers the fulfilment term of the team's next reservation's priority score."""
    team = world.t1.team
    team_record(team, used=3)
    reservation = active(world, steps)
    queued = make_reservation(world, state="queued", team=team, offering=vm_offering())
    before = reservation_rescore(queued)
    t0 = reservation.state_changed_at
    telemetry(reservation, start=t0, end=t0 + timedelta(minutes=16))
    no_show_scan(now=t0 + timedelta(minutes=16))
    telemetry(reservation, start=t0, end=t0 + timedelta(minutes=27))
    assert no_show_scan(now=t0 + timedelta(minutes=27))["no_shows"] == 1
    assert reservation_rescore(queued) < before


def test_activity_after_the_warning_cancels_it(world, fleet, steps):
    """GPUs used after the warning: the warning is withdrawn, the tenant told, and it is never warned again."""
    reservation = active(world, steps)
    t0 = reservation.state_changed_at
    telemetry(reservation, start=t0, end=t0 + timedelta(minutes=16))
    assert no_show_scan(now=t0 + timedelta(minutes=16))["warned"] == 1

    GPUSampleRollup.objects.all().delete()
    telemetry(reservation, start=t0, end=t0 + timedelta(minutes=20), busy_from=t0 + timedelta(minutes=18),
              latest_busy=True)
    assert no_show_scan(now=t0 + timedelta(minutes=20))["cleared"] == 1
    (notice,) = notices(reservation, no_shows.CLEARED)
    assert "withdrawn" in notice.body
    assert world.client("t1_member").get(f"{URL}{reservation.pk}/usage/").json()["warning"]["status"] == "cleared"

    # Idle again later: no second warning, no release.
    GPUSampleRollup.objects.all().delete()
    telemetry(reservation, start=t0 + timedelta(minutes=21), end=t0 + timedelta(minutes=40))
    assert no_show_scan(now=t0 + timedelta(minutes=40)) == {"warned": 0, "cleared": 0, "no_shows": 0,
                                                            "reclaimed": 0, "errors": 0}
    reservation.refresh_from_db()
    assert reservation.state == "active" and len(events(reservation, no_shows.WARNING)) == 1


def test_no_telemetry_is_no_evidence(world, fleet, steps):
    """No samples, a latest sample alone, or too few minutes: never warned, never released."""
    reservation = active(world, steps)
    t0 = reservation.state_changed_at
    assert no_show_scan(now=t0 + timedelta(minutes=16))["warned"] == 0
    for gpu in gpus_of(reservation):
        GPUTelemetry.objects.create(gpu=gpu, node_id=gpu.node_id, sampled_at=t0 + timedelta(minutes=15, seconds=50),
                                    utilization_pct=0, processes=0)
    assert no_show_scan(now=t0 + timedelta(minutes=16))["warned"] == 0
    telemetry(reservation, start=t0 + timedelta(minutes=10), end=t0 + timedelta(minutes=16))  # 5 of 15 minutes
    assert no_show_scan(now=t0 + timedelta(minutes=16))["warned"] == 0
    usage = world.client("t1_member").get(f"{URL}{reservation.pk}/usage/").json()
    assert usage["warning"] is None
    assert not events(reservation, no_shows.WARNING) and not notices(reservation, no_shows.WARNING)


def test_warned_reservation_is_not_released_while_its_telemetry_is_missing(world, fleet, steps):
    """Telemetry that stops after the warning holds the release; the warning is withdrawn after a while."""
    reservation = active(world, steps)
    t0 = reservation.state_changed_at
    telemetry(reservation, start=t0, end=t0 + timedelta(minutes=16))
    assert no_show_scan(now=t0 + timedelta(minutes=16))["warned"] == 1
    assert no_show_scan(now=t0 + timedelta(minutes=30))["no_shows"] == 0  # the latest sample is stale
    reservation.refresh_from_db()
    assert reservation.state == "active"
    assert no_show_scan(now=t0 + timedelta(minutes=90))["cleared"] == 1


def test_busy_reservation_is_never_warned(world, fleet, steps):
    """GPUs in use from the start: nothing happens."""
    reservation = active(world, steps)
    t0 = reservation.state_changed_at
    telemetry(reservation, start=t0, end=t0 + timedelta(minutes=30), busy_from=t0, latest_busy=True)
    for minute in (16, 20, 30):
        assert no_show_scan(now=t0 + timedelta(minutes=minute))["warned"] == 0
    assert world.client("t1_member").get(f"{URL}{reservation.pk}/usage/").json()["evidence"]["verdict"] == USED


def test_one_busy_gpu_keeps_the_reservation(world, fleet, steps):
    """Only one of its GPUs used: the reservation is in use."""
    reservation = active(world, steps)
    t0 = reservation.state_changed_at
    telemetry(reservation, start=t0, end=t0 + timedelta(minutes=16))
    busy = gpus_of(reservation)[0]
    GPUSampleRollup.objects.filter(gpu=busy, bucket__gte=t0 + timedelta(minutes=5)).update(
        idle_samples=2, utilization_sum=100, utilization_max=60)
    assert no_show_scan(now=t0 + timedelta(minutes=16))["warned"] == 0


def test_grace_zero_disables_no_shows(world, fleet, steps):
    """An offering with a no-show grace of 0 never releases its reservations as no-shows."""
    Offering.objects.filter(pk=vm_offering(2).pk).update(no_show_grace_minutes=0)
    reservation = active(world, steps)
    t0 = reservation.state_changed_at
    telemetry(reservation, start=t0, end=t0 + timedelta(minutes=40))
    assert no_show_scan(now=t0 + timedelta(minutes=16))["warned"] == 0
    assert no_show_scan(now=t0 + timedelta(minutes=40))["warned"] == 0
    assert world.client("t1_member").get(f"{URL}{reservation.pk}/usage/").json()["policy"][
        "no_show_grace_minutes"] == 0


#
# Late releases
#


def _ended(reservation, *, ago: timedelta) -> None:
    """Move the reservation's window (and its allocations) so that it ended ``ago``: its expiry was missed."""
    ends = timezone.now() - ago
    Reservation.objects.filter(pk=reservation.pk).update(starts_at=ends - timedelta(hours=2), ends_at=ends)
    Allocation.objects.filter(reservation=reservation).update(starts_at=ends - timedelta(hours=2), ends_at=ends)


def test_gpus_held_past_the_end_and_grace_are_reclaimed_with_the_delay_recorded(world, fleet, steps):
    """Past end + release grace: released now (delay in the record, high priority lost), the tenant told."""
    team = world.t1.team
    team_record(team, used=1)
    reservation = active(world, steps)
    _ended(reservation, ago=timedelta(minutes=5))
    assert no_show_scan()["reclaimed"] == 0  # inside the release grace
    late = world.client("t1_member").get(f"{URL}{reservation.pk}/usage/").json()["late_release"]
    assert late["overdue_s"] >= 300 and late["reclaim_at"]

    _ended(reservation, ago=timedelta(minutes=15))
    assert no_show_scan()["reclaimed"] == 1
    reservation.refresh_from_db()
    assert reservation.state == "releasing"
    delay = (reservation.released_at - reservation.ends_at).total_seconds()
    assert 15 * 60 <= delay < 16 * 60
    (event,) = events(reservation, no_shows.RECLAIMED)
    assert event.after["release_delay_s"] == pytest.approx(delay, abs=1)
    assert "evidence" in event.after
    (notice,) = notices(reservation, no_shows.RECLAIMED)
    assert "release delay" in notice.body
    assert no_show_scan()["reclaimed"] == 0  # once

    steps.run()
    reservation.refresh_from_db()
    assert reservation.state == "released"
    record = hp.team_hp_record(team, now=timezone.now())
    assert record.avg_release_delay_s == pytest.approx(delay / 2, abs=1)
    assessed = hp.hp_assess(team)
    assert assessed["eligible"] is False and any("release delay" in r for r in assessed["reasons"])


def test_release_grace_is_per_offering(world, fleet, steps):
    """A longer release grace waits longer before reclaiming."""
    Offering.objects.filter(pk=vm_offering(2).pk).update(release_grace_minutes=30)
    reservation = active(world, steps)
    _ended(reservation, ago=timedelta(minutes=15))
    assert no_show_scan()["reclaimed"] == 0
    _ended(reservation, ago=timedelta(minutes=31))
    assert no_show_scan()["reclaimed"] == 1


#
# The API and the policy
#


def test_usage_is_the_tenants_own(world, fleet, steps):
    """The tenant reads its reservation's usage evidence; another tenant gets a 404."""
    reservation = active(world, steps)
    t0 = reservation.state_changed_at
    telemetry(reservation, start=t0, end=timezone.now() + timedelta(minutes=1))
    response = world.client("t1_member").get(f"{URL}{reservation.pk}/usage/")
    assert response.status_code == 200
    gpus = response.json()["evidence"]["gpus"]
    assert len(gpus) == 2 and all(g["source"] == "agent" and g["utilization_pct"] == 0 for g in gpus)
    assert world.client("t2_member").get(f"{URL}{reservation.pk}/usage/").status_code == 404


def test_staff_set_the_policy_and_tenants_read_it(world):
    """The three policy fields are written by staff through the offering API and shown in the catalogue."""
    offering = vm_offering()
    response = world.client("platform_admin").patch(f"/api/v1/offerings/{offering.pk}/", {
        "no_show_grace_minutes": 0, "no_show_warning_minutes": 5, "release_grace_minutes": 30}, format="json")
    assert response.status_code == 200, response.json()
    body = world.client("t1_member").get(f"/api/v1/offerings/{offering.pk}/").json()
    assert (body["no_show_grace_minutes"], body["no_show_warning_minutes"], body["release_grace_minutes"]) == (
        0, 5, 30)


#
# Judging (pure): the agent, the BMC's GPU power, the chassis
#

NOW = timezone.now()
FRESH = NOW - timedelta(minutes=1)


def verdict(minutes, latest=None, chassis=None):
    return gpu_verdict(minutes, latest, idle_w=140.0, chassis_idle=chassis, needed=12, fresh_after=FRESH)


def test_agent_verdicts():
    """Every NVML sample idle and a fresh idle latest: idle; any busy sample: used; thin or stale: unknown."""
    idle_now = Latest(source="agent", sampled_at=NOW, utilization_pct=0, processes=0)
    assert verdict(Minutes(15, 90, 90, 90), idle_now) == IDLE
    assert verdict(Minutes(15, 90, 89, 90), idle_now) == USED
    assert verdict(Minutes(15, 90, 90, 90), Latest(source="agent", sampled_at=NOW, utilization_pct=0,
                                                   processes=1)) == USED
    assert verdict(Minutes(5, 30, 30, 30), idle_now) == UNKNOWN
    assert verdict(Minutes(15, 90, 90, 90), Latest(source="agent", sampled_at=NOW - timedelta(minutes=5),
                                                   utilization_pct=0, processes=0)) == UNKNOWN
    assert verdict(Minutes(), None) == UNKNOWN


def test_bmc_power_verdicts():
    """Bare metal: the BMC's GPU power at or below idle in every reading is idle; above it, used."""
    quiet = Latest(source="bmc", sampled_at=NOW, power_w=80.0)
    assert verdict(Minutes(15, 15, 0, 0, 15, 90.0, 15), quiet) == IDLE
    assert verdict(Minutes(15, 15, 0, 0, 15, 420.0, 10), quiet) == USED
    assert verdict(Minutes(15, 15, 0, 0, 15, 90.0, 15), Latest(source="bmc", sampled_at=NOW, power_w=500.0)) == USED


def test_bmc_chassis_verdicts():
    """Only the chassis draw: idle when the BMC read throughout and the node is at idle power; else not idle."""
    bmc = Latest(source="bmc", sampled_at=NOW)
    assert verdict(Minutes(15, 15), bmc, chassis=True) == IDLE
    assert verdict(Minutes(15, 15), bmc, chassis=False) == USED
    assert verdict(Minutes(15, 15), bmc, chassis=None) == UNKNOWN
    assert verdict(Minutes(4, 4), bmc, chassis=True) == UNKNOWN


def test_idle_power_from_settings_or_tdp(settings):
    """MERIDIAN_IDLE_POWER_W per model or for all, else the fraction of the TDP."""
    model = GPUModel(slug="h100-80gb-sxm", tdp_watts=700)
    settings.MERIDIAN_IDLE_POWER_W = {}
    assert no_shows.idle_power_w(model) == pytest.approx(700 * settings.MERIDIAN_IDLE_POWER_FRACTION)
    settings.MERIDIAN_IDLE_POWER_W = {"h100-80gb-sxm": 110}
    assert no_shows.idle_power_w(model) == 110.0
    settings.MERIDIAN_IDLE_POWER_W = 95
    assert no_shows.idle_power_w(model) == 95.0


def test_bare_metal_is_judged_by_its_bmc_chassis_power(world, fleet, steps):
    """Bare metal (no agent): the BMC read throughout and the chassis at idle power warns; a busy chassis is used."""
    from tests.provisioning.factories import offering

    reservation = active(world, steps, offering=offering("bare_metal", 8), nodes=1)
    t0 = reservation.state_changed_at
    at = t0 + timedelta(minutes=16)
    node_id = Instance.objects.get(reservation=reservation).node_id
    rows = []
    for gpu in gpus_of(reservation):
        GPUTelemetry.objects.update_or_create(gpu=gpu, defaults={
            "node_id": gpu.node_id, "sampled_at": at - timedelta(seconds=30), "source": "bmc", "temperature_c": 35})
        minute = t0.replace(second=0, microsecond=0) + timedelta(minutes=1)
        while minute < at:
            rows.append(GPUSampleRollup(gpu=gpu, period="1m", bucket=minute, samples=1, temperature_samples=1,
                                        temperature_sum=35))
            minute += timedelta(minutes=1)
    GPUSampleRollup.objects.bulk_create(rows)
    reading = NodeBMCReading.objects.update_or_create(node_id=node_id, defaults={
        "read_at": at - timedelta(seconds=30), "power_w": 1620.0})[0]
    assert no_show_scan(now=at)["warned"] == 1
    (warning,) = events(reservation, no_shows.WARNING)
    (node,) = warning.after["evidence"]["nodes"]
    assert node["verdict"] == IDLE and node["idle_power_w"] == settings.MERIDIAN_IDLE_NODE_BASE_W + 8 * 140.0

    reading.power_w, reading.read_at = 6400.0, at + timedelta(minutes=1)
    reading.save()
    GPUTelemetry.objects.filter(gpu__in=gpus_of(reservation)).update(sampled_at=at + timedelta(minutes=1))
    assert no_show_scan(now=at + timedelta(minutes=1, seconds=10))["cleared"] == 1


def test_a_released_reservation_never_shows_the_next_tenants_samples(world, fleet, steps):
    """After release its GPUs may be someone else's: a latest sample taken later is not its evidence."""
    reservation = active(world, steps)
    t0 = reservation.state_changed_at
    telemetry(reservation, start=t0, end=timezone.now() + timedelta(minutes=1))
    released = timezone.now()
    Reservation.objects.filter(pk=reservation.pk).update(state="released", released_at=released)
    for gpu in gpus_of(reservation):  # the next tenant is busy on the same GPUs
        GPUTelemetry.objects.filter(gpu=gpu).update(sampled_at=released + timedelta(minutes=5),
                                                    utilization_pct=97, processes=3, power_w=650.0)
    reservation.refresh_from_db()
    evidence = no_shows.usage_evidence(reservation, now=released + timedelta(minutes=6))
    assert all(g["utilization_pct"] is None and g["processes"] is None and g["power_w"] is None
               for g in evidence["gpus"])
