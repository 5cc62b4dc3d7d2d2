"""
The demo world's billing (``make run``): five weeks of finished work by Acme's and Globex's teams
on the shared hosts, metered into the ledger at once, and last month's invoices closed -- so the
billing page has an invoice, a credit line where an outage cost hours, and this month's draft; the
spot market's first prices; and Acme's Language models team's commitment: a year of 8 H100s in the
first region, its capacity placed at once and billed from the first metered hour.
"""

from __future__ import annotations

import random
from datetime import timedelta

from django.utils import timezone

from billing.commitments import commitment_create
from billing.invoices import close_month, month_bounds
from billing.meter import hour_floor, meter_run
from billing.spot import spot_update
from cloud.models import GPU, Offering
from provisioning.models import Allocation, Reservation
from security.models import Incident
from tenants.choices import TenantRole
from tenants.models import Membership, Team
from tenants.scoping import Principal

DAYS = 35


def seed_demo_usage() -> dict:
    now = timezone.now()
    start = hour_floor(now) - timedelta(days=DAYS)
    gpus = list(GPU.objects.filter(node__pool="shared", node__region__slug="us-east-1").select_related(
        "node__region").order_by("node__hostname", "index")[:32])
    offering = Offering.objects.filter(kind="vm", gpus_per_unit=1, gpu_model_id__in={g.model_id for g in gpus}).first()
    teams = list(Team.objects.filter(tenant__slug__in=["acme", "globex"]).select_related("tenant"))
    if not offering or not gpus or not teams:
        return {"reservations": 0}
    rng = random.Random(2026)  # noqa: S311 -- demo data, the same each time
    made = 0
    for gpu in gpus:
        at = start + timedelta(hours=rng.randrange(0, 12))
        while at < now - timedelta(hours=2):
            team = rng.choice(teams)
            length = timedelta(hours=rng.choice([4, 8, 12, 24, 36, 48]))
            end = min(at + length, now - timedelta(hours=1))
            reservation = Reservation.objects.create(
                tenant=team.tenant, team=team, name=f"{team.slug}-run-{made}", offering=offering,
                gpu_model_id=offering.gpu_model_id, units=1, gpus=1, regions=[gpu.node.region.slug],
                region=gpu.node.region, duration=end - at, state="released", starts_at=at, ends_at=end,
                released_at=end, billing_term=rng.choice(["on_demand", "on_demand", "reserved", "spot"]))
            Allocation.objects.create(reservation=reservation, gpu=gpu, node=gpu.node, mem_lo=0,
                                      mem_hi=gpu.memory_mib, starts_at=at, ends_at=end)
            made += 1
            at = end + timedelta(hours=rng.randrange(0, 6))
    # Last month a bad host took GPUs from four of Acme's runs for most of two days: availability fell
    # under the SLA's target, and the invoice carries the credit.
    this_month, _ = month_bounds(now)
    for hit in Reservation.objects.filter(tenant__slug="acme", starts_at__gte=this_month - timedelta(days=20),
                                          ends_at__lt=this_month, duration__gte=timedelta(hours=48))[:4]:
        Incident.objects.create(kind="gpu_failure", summary="GPU fell off the bus (XID 79)", tenant_id=hit.tenant_id,
                                reservation_id=hit.pk, gpus_affected=1, impact_started_at=hit.starts_at,
                                restored_at=hit.starts_at + timedelta(hours=40))
    metered = meter_run(now=now)
    closed = close_month(this_month - timedelta(days=1), now=now)
    spot_update(now=now)  # the market's first prices: the beat sets them every few minutes from here
    committed = seed_demo_commitment(offering, gpus[0].node.region)
    return {"reservations": made, "commitment": committed, **metered, **closed}


def seed_demo_commitment(offering: Offering, region) -> bool:
    """Alice commits Acme's Language models team to 8 GPUs of ``offering`` for 12 months, from now."""
    team = Team.objects.filter(tenant__slug="acme", slug="nlp").select_related("tenant").first()
    owner = Membership.objects.filter(tenant__slug="acme", role=TenantRole.OWNER).select_related("user").first()
    if team is None or owner is None:
        return False
    actor = Principal(user=owner.user, tenant=team.tenant, role=TenantRole.OWNER)
    commitment_create(actor=actor, name="nlp-training-year", offering=offering, region=region, gpus=8, months=12,
                      team=team)
    return True
