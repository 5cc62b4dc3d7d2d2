"""
What counts against a GPU quota (``admission.gpus_counted``): PostgreSQL's written statement gives
what the ORM's query gives -- placed work by its window, waiting work by the window it asked for
or as if it started now, fractional slots as GPU shares, per tenant or per team, per model or all
-- for windows before, across and after the work.
"""

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from cloud.catalogue import load_gpu_catalogue
from cloud.models import GPUModel
from provisioning import admission
from tenants.quotas import QuotaLimit
from tests.provisioning.factories import make_reservation, offering

pytestmark = pytest.mark.skipif(connection.vendor != "postgresql", reason="the written statement is PostgreSQL's")


def test_the_written_statement_counts_what_the_orm_counts(world):
    load_gpu_catalogue(GPUModel)
    now = timezone.now()
    hour = timedelta(hours=1)
    team = world.t1.team
    metal, slots = offering("bare_metal", 8), offering("container", 1, slots_per_gpu=7)
    other_model = offering("vm", 1, model="a100-80gb-sxm")
    placed = {"starts_at": now - hour, "ends_at": now + hour}
    tenant, model, ever = world.t1.tenant, metal.gpu_model_id, (now - 5 * hour, now + 50 * hour)
    everything = QuotaLimit(scope="tenant", resource="gpus", gpu_model_id=None, limit=100)
    before = admission._gpus_counted_postgresql(tenant, team, everything, *ever)  # the world's own work
    for fields in [
        {"state": "scheduled", **placed},                                             # now
        {"state": "active", **placed, "team": team},                                  # now, the team's
        {"state": "scheduled", "starts_at": now - 3 * hour, "ends_at": now - 2 * hour},  # over
        {"state": "provisioning", "starts_at": now + 10 * hour, "ends_at": now + 12 * hour},  # later
        {"state": "queued"},                                                          # as soon as possible
        {"state": "queued", "requested_start": now + 5 * hour},                      # an advance window
        {"state": "pending", "requested_start": now + 30 * hour, "team": team},
        {"state": "queued", "offering": slots, "units": 3},                            # 3/7 of a GPU
        {"state": "scheduled", "offering": slots, "units": 5, **placed, "team": team},
        {"state": "scheduled", "offering": other_model, **placed},
        {"state": "released", **placed},                                              # no longer counts
    ]:
        make_reservation(world, offering=fields.pop("offering", metal), units=fields.pop("units", 1), **fields)
    make_reservation(world, side="t2", offering=metal, state="scheduled", **placed)  # another tenant's

    limits = [QuotaLimit(scope=scope, resource="gpus", gpu_model_id=m, limit=100)
              for scope in ("tenant", "team") for m in (None, model)]
    windows = [(now, now + hour), (now + 4 * hour, now + 8 * hour), (now + 9 * hour, now + 40 * hour),
               (now - 3 * hour, now - 2 * hour), ever]
    seen = set()
    for limit in limits:
        for start, end in windows:
            written = admission._gpus_counted_postgresql(tenant, team, limit, start, end)
            orm = admission._gpus_counted_orm(tenant, team, limit, start, end)
            assert written == pytest.approx(orm), (limit, start)
            assert admission._gpus_counted_postgresql(tenant.pk, team.pk, limit, start, end) == written  # by id
            seen.add(round(written, 3))
    assert len(seen) >= 6  # the windows and scopes do tell the work apart
    added = admission._gpus_counted_postgresql(tenant, team, everything, *ever) - before
    assert added == pytest.approx(8 * 7 + 3 / 7 + 5 / 7 + 1)  # seven bare-metal nodes, the slots, the other VM
