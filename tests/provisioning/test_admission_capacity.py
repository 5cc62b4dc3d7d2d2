"""
Admission's "never fits" capacity count (``RegionSizes``): the largest of the regions asked, as
counted; a count younger than its time to live lets an ask that fits through without counting
again, but a refusal is always counted afresh -- a region that grew is seen at once.
"""

from unittest import mock

import pytest

from cloud.catalogue import load_gpu_catalogue
from cloud.choices import Health
from cloud.fleet import FleetSpec, build_fleet
from cloud.models import GPU, GPUModel, Region
from provisioning.admission import RegionSizes
from tests.world import vm_offering

pytestmark = pytest.mark.django_db


@pytest.fixture
def regions():
    load_gpu_catalogue(GPUModel)
    build_fleet(FleetSpec(regions=2, nodes_per_fabric=8, spare_ratio=0.25, shared_ratio=0.25))
    return list(Region.objects.order_by("slug"))


def sellable(offering, region) -> int:
    return GPU.objects.filter(model=offering.gpu_model, node__pool="shared", node__is_spare=False,
                              node__region=region, health__in=["healthy", "degraded"]).count()


def test_the_largest_region_asked_is_counted(regions):
    offering = vm_offering(1)
    first, second = regions  # the second has the H100s
    GPU.objects.filter(node__region=first).update(health=Health.FAILED)  # nothing sellable left there
    assert RegionSizes().largest(offering, [first], at_least=1) == 0
    assert RegionSizes().largest(offering, [first, second], at_least=1) == sellable(offering, second) > 0


def test_a_recent_count_lets_a_fitting_ask_through_without_counting(regions, django_assert_num_queries):
    offering = vm_offering(1)
    sizes = RegionSizes(ttl_s=30)
    full = sizes.largest(offering, regions, at_least=1)
    with django_assert_num_queries(0):
        assert sizes.largest(offering, regions, at_least=full) == full
    with (mock.patch("provisioning.admission.time.monotonic", return_value=10**9),
          django_assert_num_queries(1)):  # too old: counted again
        sizes.largest(offering, regions, at_least=1)


def test_a_refusal_is_always_counted_afresh(regions, django_assert_num_queries):
    offering = vm_offering(1)
    sizes = RegionSizes(ttl_s=30)
    first = max(regions, key=lambda region: sellable(offering, region))
    GPU.objects.filter(node__region=first).update(health=Health.FAILED)
    assert sizes.largest(offering, [first], at_least=1) == 0
    GPU.objects.filter(node__region=first).update(health=Health.HEALTHY)  # repaired
    repaired = sellable(offering, first)
    with django_assert_num_queries(1):
        assert sizes.largest(offering, [first], at_least=1) == repaired > 0
