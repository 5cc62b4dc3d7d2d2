"""The demo's endpoint: Acme's chat model on real-time time slices, under a synthetic load that rises and falls."""

from __future__ import annotations

from inference.endpoints import Share, endpoint_create
from inference.models import Endpoint
from tenants.choices import TenantRole
from tenants.models import Membership, Team
from tenants.scoping import Principal

# One replica's worth of work at 40 % most of the time; 1.9 replicas' worth for 4 minutes of every 10:
# the autoscaler goes out to three replicas at each peak and back to one after it.
DEMO_LOAD = {"base": 0.4, "peak": 1.9, "period_s": 600, "peak_s": 240}


def seed_demo_endpoint() -> Endpoint | None:
    team = Team.objects.filter(tenant__slug="acme", slug="nlp").select_related("tenant").first()
    owner = Membership.objects.filter(tenant__slug="acme", role=TenantRole.OWNER).select_related("user").first()
    if team is None or owner is None:
        return None
    actor = Principal(user=owner.user, tenant=team.tenant, role=TenantRole.OWNER)
    endpoint = endpoint_create(
        actor=actor, name="chat", team=team, regions=["us-east-1"],
        share=Share(gpu_model="h100-80gb-sxm", kind="time_slice", fraction=4, time_slice_class="realtime"),
        min_replicas=1, max_replicas=4, scale_in_stabilization_seconds=120)
    Endpoint.objects.filter(pk=endpoint.pk).update(synthetic_load=DEMO_LOAD)
    return endpoint
