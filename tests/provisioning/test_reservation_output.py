"""The reservation's answer, written out for speed, says exactly what its declared fields would."""

from datetime import timedelta
from decimal import Decimal

from django.utils import timezone
from rest_framework import serializers

from cloud.models import Region
from provisioning.api.serializers import ReservationSerializer
from tests.provisioning.factories import make_reservation, offering
from tests.world import small_fleet, world_vpc


def generic(reservation) -> dict:
    """What DRF's field-by-field ModelSerializer output is for the same reservation."""
    return serializers.ModelSerializer.to_representation(ReservationSerializer(reservation), reservation)


def test_the_written_out_answer_matches_the_declared_fields_for_every_kind_of_reservation(world):
    small_fleet(4)
    now = timezone.now()
    side = world.side("t1")
    queued = make_reservation(world, state="queued")
    scheduled = make_reservation(world, state="scheduled", region=Region.objects.first(), starts_at=now,
                                 ends_at=now + timedelta(hours=1), scheduled_at=now, team=side.team,
                                 spec={"min_memory_gib": 80})
    spot = make_reservation(world, state="released", billing_term="spot", spot_max_price=Decimal("1.25"),
                            eviction_policy="hard", requested_start=now + timedelta(days=2), released_at=now,
                            vpc=world_vpc(side.tenant), urgency=0.9, score=0.123456789)
    slots = offering("container", gpus_per_unit=1, slots_per_gpu=7)
    fractional = make_reservation(world, state="queued", offering=slots, units=3)
    for reservation in (queued, scheduled, spot, fractional):
        reservation.refresh_from_db()
        assert ReservationSerializer(reservation).data == generic(reservation)
    assert ReservationSerializer(spot).data["spot_max_price"] == "1.2500"
    assert ReservationSerializer(scheduled).data["starts_at"].endswith("Z")


def test_a_list_answers_each_row_as_the_declared_fields_would(world):
    small_fleet(1)
    rows = [make_reservation(world, state="queued") for _ in range(3)]
    assert ReservationSerializer(rows, many=True).data == [generic(r) for r in rows]
