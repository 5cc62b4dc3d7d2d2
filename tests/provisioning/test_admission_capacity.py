"""
Admission's "never fits" capacity count: with ``enough`` it stops once a region has that many
sellable GPUs (a 1-GPU ask reads a row or two, not the region's thousands), and agrees with the
full count below that; a region too small hands the question to the next one asked.
"""

import pytest

from cloud.catalogue import load_gpu_catalogue
from cloud.choices import Health
from cloud.fleet import FleetSpec, build_fleet
from cloud.models import GPU, GPUModel, Region
from provisioning.admission import region_capacity
from tests.world import vm_offering

pytestmark = pytest.mark.django_db


@pytest.fixture
def regions():
    load_gpu_catalogue(GPUModel)
    build_fleet(FleetSpec(regions=2, nodes_per_fabric=8, spare_ratio=0.25, shared_ratio=0.25))
    return list(Region.objects.order_by("slug"))


def test_the_count_stops_at_enough_and_agrees_with_the_full_count_below_it(regions):
    offering = vm_offering(1)
    full = region_capacity(offering, regions)
    assert full > 2
    assert region_capacity(offering, regions, enough=2) == 2
    assert region_capacity(offering, regions, enough=full) == full
    assert region_capacity(offering, regions, enough=full + 1) == full


def test_a_region_without_enough_hands_the_question_to_the_next(regions):
    offering = vm_offering(1)
    first, second = regions
    GPU.objects.filter(node__region=first).update(health=Health.FAILED)  # nothing sellable left there
    assert region_capacity(offering, [first]) == 0
    assert region_capacity(offering, [first], enough=1) == 0
    assert region_capacity(offering, [first, second], enough=1) == 1
    assert region_capacity(offering, [first, second]) == region_capacity(offering, [second])
