"""The balancer hears of replicas' reservation changes without a query per reservation on the scheduler's path."""

from __future__ import annotations

from django.db import connection
from django.test.utils import CaptureQueriesContext

from inference.balancer import any_replica
from inference.models import Replica
from provisioning.models import Reservation
from tests.provisioning.factories import make_reservation
from tests.world import world_endpoint


def test_replicas_are_told_apart_in_at_most_one_query_however_the_rows_were_read(world):
    plain = [make_reservation(world) for _ in range(5)]
    endpoint = world_endpoint(world.t1.tenant)
    replica = make_reservation(world, managed_by=f"endpoint:{endpoint.pk}")
    Replica.objects.create(tenant=world.t1.tenant, endpoint=endpoint, reservation=replica)
    with CaptureQueriesContext(connection) as loaded:
        assert any_replica(plain + [replica]) and not any_replica(plain)
    assert len(loaded.captured_queries) == 0  # managed_by read off the rows
    few = list(Reservation.objects.only("id", "tenant_id", "state").order_by("submitted_at"))
    with CaptureQueriesContext(connection) as deferred:
        assert any_replica(few)
    assert len(deferred.captured_queries) == 1
    assert not any_replica(list(Reservation.objects.only("id").filter(pk__in=[r.pk for r in plain])))
