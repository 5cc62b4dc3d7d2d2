"""Storage usage for billing (storage.usage): GiB sampled per tenant, team and class; GiB-hours and spend shown."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from storage.models import StorageUsageSample, Volume
from storage.usage import storage_spend, usage_sample

pytestmark = pytest.mark.django_db


def test_billed_volumes_are_sampled_and_add_up_to_gib_hours_and_spend(world, settings):
    settings.MERIDIAN_STORAGE_USAGE_SECONDS = 3600
    volume = world.t1.objects[Volume]  # 100 GiB of shared file system at $0.20 a GiB-month
    Volume.objects.create(tenant=world.t1.tenant, name="going", storage_class=volume.storage_class, size_gib=50,
                          target_gib=50, state="deleting")  # not billed: its delete was asked
    now = timezone.now()
    for hours in (2, 1, 0):
        assert usage_sample(now - timedelta(hours=hours)) == 1  # t1's one billed group; t2 has none yet
    spend = storage_spend([world.t1.tenant.pk], since=now - timedelta(days=1), until=now)[world.t1.tenant.pk]
    assert spend.gib_now == 100 and spend.gib_hours == 300.0
    assert spend.amount == (Decimal(300) * Decimal("0.2000") / 730).quantize(Decimal("0.01"))
    assert storage_spend([world.t2.tenant.pk], since=now - timedelta(days=1), until=now) == {}
    assert StorageUsageSample.objects.filter(tenant=world.t1.tenant).count() == 3
