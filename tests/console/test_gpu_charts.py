"""The reservation page's GPU charts: server-drawn sparklines with their figures said in words."""

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from cloud.models import GPUSampleRollup, RollupPeriod
from provisioning.models import Allocation
from tests.provisioning.pipeline import reserve_on_small_fleet
from web.charts import sparkline

pytestmark = pytest.mark.django_db


def test_a_sparkline_names_its_figures_and_leaves_gaps():
    svg = str(sparkline([10, 50, None, 90], top=100, label="Utilization", unit=" %"))
    assert 'role="img"' in svg and "Utilization: min 10 %, mean 50 %, max 90 %" in svg
    assert svg.count("<polyline") == 2  # the gap splits the line
    assert "no data yet" in str(sparkline([None, None], top=100, label="Power"))
    assert "&lt;script" in str(sparkline([1.0], top=1, label="<script>"))  # a label is escaped


def test_an_active_reservation_charts_its_gpus_last_hour(console, world, steps):
    pk = reserve_on_small_fleet(world)
    steps.run()
    allocation = Allocation.objects.get(reservation_id=pk)
    Allocation.objects.filter(pk=allocation.pk).update(starts_at=timezone.now() - timedelta(minutes=30))
    start = timezone.now().replace(second=0, microsecond=0) - timedelta(minutes=20)
    GPUSampleRollup.objects.bulk_create([GPUSampleRollup(
        gpu_id=allocation.gpu_id, period=RollupPeriod.MINUTE, bucket=start + timedelta(minutes=i), samples=6,
        utilization_samples=6, utilization_sum=6 * (40 + i), utilization_sumsq=6 * (40 + i) ** 2,
        utilization_max=40 + i, memory_used_max=20480, power_samples=6, power_sum=6 * 500.0, power_max=520.0)
        for i in range(10)])
    page = console("t1_member").get(reverse("reservation-detail", args=[pk])).content.decode()
    card = page.split('id="gpus-title"')[1].split("</section>")[0]
    assert "Utilization: min 40 %, mean 44 %, max 49 %" in card
    assert "Memory used: min 20 GiB, mean 20 GiB, max 20 GiB" in card and "Power: min 500 W" in card
    assert console("t2_member").get(reverse("reservation-detail", args=[pk])).status_code == 404
