"""
The console's history (provisioning.history): each sample gives queued reservations the place
and estimated start their page shows, counts the fleet's held GPUs per model and region, and is
pruned after the retention; the charts drawn from it carry their figures in words.
"""

from datetime import timedelta

import pytest
from django.utils import timezone

from operations.occupancy import occupancy_chart
from provisioning.history import history_sample, queue_history
from provisioning.models import OccupancySample, QueueSample, Reservation
from provisioning.scheduling.queue import estimated_start, queue_position
from provisioning.staff_actions import reservation_hold
from provisioning.views import queue_charts
from tests.provisioning.pipeline import reserve_vm
from tests.world import small_fleet

pytestmark = pytest.mark.django_db
URL = "/api/v1/reservations/"


@pytest.fixture
def queued(world):
    small_fleet(4)
    Reservation.objects.filter(state="queued").delete()  # the world's own: only this test's queue
    assert reserve_vm(world, gpus=8).state == "scheduled"
    return [reserve_vm(world, urgency=0.9), reserve_vm(world, "t2_member", urgency=0.3), reserve_vm(world, urgency=0.5)]


def test_a_sample_gives_each_queued_reservation_the_place_and_start_its_page_shows(world, queued):
    now = timezone.now()
    counts = history_sample(now)
    assert counts["queue"] == 3
    for reservation in queued:
        reservation.refresh_from_db()
        sample = QueueSample.objects.get(reservation=reservation)
        assert sample.position == queue_position(reservation)
        assert sample.estimated_start == estimated_start(reservation, now)
    assert sorted(QueueSample.objects.values_list("position", flat=True)) == [1, 2, 3]


def test_held_reservations_are_not_sampled(world, queued):
    reservation_hold(actor=world.principal("platform_admin"), reservation=queued[0], note="Wait")
    history_sample()
    assert not QueueSample.objects.filter(reservation=queued[0]).exists()
    assert sorted(QueueSample.objects.values_list("position", flat=True)) == [1, 2]


def test_occupancy_counts_held_and_sellable_gpus_per_model_region_and_pool(world, queued):
    history_sample()
    shared = OccupancySample.objects.get(pool="shared")
    assert (shared.held, shared.gpus) == (8, 8)
    bare = OccupancySample.objects.get(pool="bare_metal")
    assert bare.held == 0 and bare.gpus > 0


def test_samples_past_the_retention_are_pruned(world, queued, settings):
    settings.MERIDIAN_HISTORY_RETENTION = timedelta(days=1)
    old = timezone.now() - timedelta(days=2)
    history_sample(old)
    assert QueueSample.objects.filter(at=old).count() == 3
    expected = 3 + OccupancySample.objects.filter(at=old).count()
    assert history_sample()["pruned"] == expected
    assert not QueueSample.objects.filter(at=old).exists() and not OccupancySample.objects.filter(at=old).exists()


def test_the_queue_charts_follow_the_samples_in_order(world, queued):
    now = timezone.now()
    for minutes in (30, 20, 10):
        history_sample(now - timedelta(minutes=minutes))
    last = queued[1]
    samples = queue_history(last)
    assert [s.at for s in samples] == sorted(s.at for s in samples) and len(samples) == 3
    charts = queue_charts(last)
    assert charts["count"] == 3 and charts["rows"][0].at == samples[-1].at  # newest first in the table
    assert 'aria-label="Place in the queue over time: Place ' in str(charts["position"])
    assert "Expected wait in hours over time" in str(charts["wait"])


def test_the_occupancy_chart_names_each_line_with_its_share(world, queued):
    assert occupancy_chart(timezone.now()) is None  # nothing sampled yet
    history_sample()
    chart = occupancy_chart(timezone.now())
    assert all(" · " in name for name, _ in chart["legend"])  # "<GPU model> · <region>"
    samples = OccupancySample.objects.all()
    share = 100.0 * sum(s.held for s in samples) / sum(s.gpus for s in samples)  # both pools together
    [row] = chart["rows"]  # one GPU model in one region
    assert row["latest"] == row["peak"] == pytest.approx(share) and 0 < share < 100
    assert f"{row['name']} {share:,.2f}" in str(chart["svg"])


def test_the_occupancy_chart_goes_by_the_minute_for_a_young_history_and_by_the_hour_after_a_day(world, queued):
    now = timezone.now()
    history_sample(now - timedelta(minutes=30))
    history_sample(now)
    young = occupancy_chart(now)
    assert "by the minute" in young["period"] and "<polyline" not in str(young["svg"])  # two dots, 30 min apart
    assert str(young["svg"]).count("<circle") == 2
    history_sample(now - timedelta(days=3))
    old = occupancy_chart(now)
    assert old["period"] == "last 7 days, hourly"
    assert str(old["svg"]).count("<circle") >= 1  # the lone hour three days ago; the last half hour is one or two
