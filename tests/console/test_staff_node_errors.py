"""
The staff node page's error history and links, from telemetry as agents send it: XIDs over the
last week (hourly rollups, the minute ones for the current hour), the last XID codes with their
time, ECC counters, and each InfiniBand port's link with its recent changes.
"""

from datetime import timedelta

import pytest
from django.utils import timezone

from cloud import telemetry
from cloud.models import GPUSampleRollup, RollupPeriod
from cloud.telemetry import gpu_error_history
from provisioning.models import NodeValidation
from tests.cloud.test_telemetry import ports_of, samples_of
from tests.world import small_fleet

pytestmark = pytest.mark.django_db


@pytest.fixture
def node(world):
    return next(n for n in small_fleet(4) if n.pool == "bare_metal" and not n.is_spare)


def test_xids_of_the_week_and_the_last_codes_are_counted_per_gpu(node):
    now = timezone.now()
    gpus = list(node.gpus.order_by("index"))
    first, second = gpus[0], gpus[1]
    hour = now.replace(minute=0, second=0, microsecond=0)
    GPUSampleRollup.objects.bulk_create([
        GPUSampleRollup(gpu=first, period=RollupPeriod.HOUR, bucket=hour - timedelta(days=2), samples=360,
                        xid_count=3),
        GPUSampleRollup(gpu=first, period=RollupPeriod.HOUR, bucket=hour - timedelta(days=9), samples=360,
                        xid_count=50),
        # A closed hour still in minutes is counted once: from its hourly rollup, not twice.
        GPUSampleRollup(gpu=first, period=RollupPeriod.MINUTE, bucket=hour - timedelta(days=2), samples=6, xid_count=3),
    ])
    samples = samples_of(node)
    samples[0]["xids"] = [79]
    samples[0]["ecc_uncorrected"] = 2
    telemetry.ingest(node=node, samples=samples, ports=ports_of(node), now=now - timedelta(minutes=2))
    telemetry.rollup(now=now)
    history = gpu_error_history([g.pk for g in gpus], now=now)
    assert history[first.pk]["xids"] == 3 + 1  # the new one too, in this hour's minutes or the last hour's rollup
    assert history[first.pk]["last_xids"] == [79]
    assert history[second.pk] == {"xids": 0, "last_xids": [], "last_xid_at": None}


def test_the_node_page_shows_xids_ecc_and_port_links(console, node):
    now = timezone.now()
    samples = samples_of(node)
    samples[0]["xids"] = [48, 79]
    samples[0]["ecc_corrected"], samples[0]["ecc_uncorrected"] = 12, 1
    telemetry.ingest(node=node, samples=samples, ports=ports_of(node, link="up"), now=now - timedelta(seconds=20))
    telemetry.ingest(node=node, samples=samples_of(node), ports=ports_of(node, link="down"), now=now)
    body = console("platform_admin").get(f"/staff/fleet/nodes/{node.pk}/").content.decode()
    assert "XIDs, 7 days" in body and "XID 48, 79" in body
    assert "12 / <strong>1</strong>" not in body  # the newest sample's counters, not the first one's
    assert body.count("none in the last hour") == node.gpus.count() - 1
    assert "Down</span>" in body and "1 change lately" in body and "by the agent" in body


def test_the_node_page_shows_nvlinks_up_of_those_present(console, node):
    samples = samples_of(node)
    samples[0].update(nvlink_up=17, nvlink_total=18)
    samples[1].update(nvlink_up=18, nvlink_total=18)
    telemetry.ingest(node=node, samples=samples, ports=[], now=timezone.now())
    body = console("platform_admin").get(f"/staff/fleet/nodes/{node.pk}/").content.decode()
    assert '<span class="badge state-failed">17/18 up</span>' in body
    assert '<span class="badge state-passed">18/18 up</span>' in body


@pytest.mark.parametrize(("up", "total"), [(19, 18), (-1, 18), (2, 65), (True, 18), (1.5, 18)])
def test_nvlink_readings_out_of_range_are_refused_and_nothing_is_stored(node, up, total):
    from cloud.models import GPUTelemetry
    from core.errors import DomainError

    samples = samples_of(node)
    samples[0].update(nvlink_up=up, nvlink_total=total)
    with pytest.raises(DomainError) as refused:
        telemetry.ingest(node=node, samples=samples, ports=[], now=timezone.now())
    assert "nvlink" in str(refused.value.detail)
    assert not GPUTelemetry.objects.filter(node=node).exists()


def test_a_port_never_reported_says_so(console, node):
    body = console("platform_approver").get(f"/staff/fleet/nodes/{node.pk}/").content.decode()
    assert body.count("not reported yet") == node.ib_ports.count() > 0


def test_the_node_page_shows_the_failed_acceptance_checks_and_the_node_shape(console, node):
    NodeValidation.objects.create(node=node, passed=False, results=[
        {"gpu": 5, "check": "pcie_width", "value": 8, "bound": "at least x16", "passed": False},
        {"gpu": None, "check": "nccl_busbw_gbs", "value": 120.0, "bound": "at least 350.0 GB/s", "passed": False},
        {"gpu": 0, "check": "ecc_mode", "value": "on", "bound": "on", "passed": True}])

    body = console("platform_admin").get(f"/staff/fleet/nodes/{node.pk}/").content.decode()

    assert "2 of 3 failed" in body
    assert "<td>GPU 5</td><td>pcie_width</td><td>8</td><td>at least x16</td>" in body
    assert "<td>node</td><td>nccl_busbw_gbs</td>" in body and "ecc_mode" not in body
    assert "8 GPUs, " in body and "GPU CC mode" in body
