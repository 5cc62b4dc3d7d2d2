"""The demo world the run command seeds on first start: a small fleet, offerings, two tenants."""

from __future__ import annotations

from decimal import Decimal

from django.db import transaction

from cloud.choices import IsolationMode, OfferingKind
from cloud.fleet import FleetSpec, build_fleet
from cloud.models import GPUModel, Offering
from provisioning.drivers.simulated_devices import trust_simulated_fleet
from tenants.choices import PlatformRole, QuotaResource, TeamRole, TenantRole
from tenants.models import Membership, Quota, Team, TeamMembership, Tenant, User

DEMO_PASSWORD = "meridian-demo-2026"

# (email, full name, tenant slug or None, tenant role, platform role, [(team slug, team role)])
DEMO_USERS = [
    ("admin@meridian.example", "Platform Admin", None, None, PlatformRole.ADMIN, []),
    ("approver@meridian.example", "Platform Approver", None, None, PlatformRole.APPROVER, []),
    ("alice@acme.example", "Alice Owner", "acme", TenantRole.OWNER, "", [("vision", TeamRole.ADMIN)]),
    ("bob@acme.example", "Bob Member", "acme", TenantRole.MEMBER, "", [("vision", TeamRole.MEMBER)]),
    ("vera@acme.example", "Vera Viewer", "acme", TenantRole.VIEWER, "", []),
    ("carol@globex.example", "Carol Owner", "globex", TenantRole.OWNER, "", [("research", TeamRole.ADMIN)]),
    ("dan@globex.example", "Dan Member", "globex", TenantRole.MEMBER, "", [("research", TeamRole.MEMBER)]),
]
DEMO_TENANTS = {
    "acme": ("Acme AI", [("vision", "Vision"), ("nlp", "Language models")]),
    "globex": ("Globex Research", [("research", "Research")]),
}

# (GPU model slug, on-demand price per GPU-hour)
LIST_PRICES = {"h100-80gb-sxm": Decimal("2.49"), "h200-141gb-sxm": Decimal("3.39"),
               "a100-80gb-sxm": Decimal("1.29"), "b200-180gb-sxm": Decimal("4.99")}


def offerings_for(model: GPUModel) -> list[dict]:
    short = model.slug.split("-")[0]
    price = LIST_PRICES.get(model.slug, Decimal("2.00"))
    spot = {"spot_available": True, "spot_floor_price": (price * Decimal("0.4")).quantize(Decimal("0.01"))}
    base = {"gpu_model": model, "price_per_gpu_hour": price, "reserved_discount_pct": Decimal("30")}
    rows = [
        {"slug": f"bm-{short}x8", "name": f"Bare metal 8x {model.name}", "kind": OfferingKind.BARE_METAL,
         "gpus_per_unit": 8, **base, **spot},
        {"slug": f"vm-{short}x1", "name": f"VM 1x {model.name}", "kind": OfferingKind.VM, "gpus_per_unit": 1,
         **base, **spot},
        {"slug": f"vm-{short}x8", "name": f"VM 8x {model.name}", "kind": OfferingKind.VM, "gpus_per_unit": 8, **base},
        {"slug": f"ct-{short}x1", "name": f"Container 1x {model.name}", "kind": OfferingKind.CONTAINER,
         "gpus_per_unit": 1, **base, **spot},
    ]
    if model.supports_mig:
        slice_gib = model.memory_gib // model.mig_max_instances
        rows.append({
            "slug": f"ct-{short}-mig", "name": f"Container, MIG slice ({slice_gib} GiB) of {model.name}",
            "kind": OfferingKind.CONTAINER, "gpus_per_unit": 1, "slots_per_gpu": model.mig_max_instances,
            "isolation_mode": IsolationMode.MIG, **base,
        })
    return rows


@transaction.atomic
def seed_demo(*, regions: int = 2, nodes: int = 64, progress=None) -> bool:
    """Seed the demo world unless it exists; returns whether anything was created."""
    if Tenant.objects.filter(slug="acme").exists():
        return False
    build_fleet(FleetSpec(regions=regions, nodes_per_fabric=nodes), progress=progress)
    trust_simulated_fleet()  # the simulated GPUs' device CA and firmware reference values
    for model in GPUModel.objects.filter(gpus__isnull=False).distinct():
        for row in offerings_for(model):
            Offering.objects.get_or_create(slug=row.pop("slug"), defaults=row)
    teams = {}
    for slug, (name, team_rows) in DEMO_TENANTS.items():
        tenant = Tenant.objects.create(slug=slug, name=name)
        Quota.objects.create(tenant=tenant, resource=QuotaResource.GPUS, limit=128)
        for team_slug, team_name in team_rows:
            teams[team_slug] = Team.objects.create(tenant=tenant, slug=team_slug, name=team_name)
    for email, full_name, tenant_slug, role, platform_role, team_roles in DEMO_USERS:
        user = User.objects.create_user(email, DEMO_PASSWORD, full_name=full_name, platform_role=platform_role)
        if tenant_slug:
            Membership.objects.create(tenant=Tenant.objects.get(slug=tenant_slug), user=user, role=role)
        for team_slug, team_role in team_roles:
            TeamMembership.objects.create(team=teams[team_slug], user=user, role=team_role)
    return True
