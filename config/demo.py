"""The demo world the run command seeds on first start: a small fleet, offerings, two tenants."""

from __future__ import annotations

import hashlib
from decimal import Decimal

from django.db import transaction

from billing.demo import seed_demo_usage
from cloud.choices import IsolationMode, OfferingKind
from cloud.fleet import FleetSpec, build_fleet
from cloud.models import GPUModel, Image, Offering, Region
from inference.demo import seed_demo_endpoint
from provisioning.drivers.simulated_devices import trust_simulated_fleet
from storage.catalogue import default_storage_classes
from storage.demo import seed_demo_storage
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


# The public images: (name, kind, OS, CUDA, driver, size, source), the first of each kind its default.
DEMO_IMAGES = [
    ("Ubuntu 24.04 + CUDA 12.8 (server)", OfferingKind.BARE_METAL, "ubuntu-24.04", "12.8", "570.86",
     9 * 2**30, "https://images.meridian.example/ubuntu-24.04-cuda-12.8-server.img"),
    ("Ubuntu 24.04 + CUDA 12.8 (VM disk)", OfferingKind.VM, "ubuntu-24.04", "12.8", "570.86",
     6 * 2**30, "https://images.meridian.example/ubuntu-24.04-cuda-12.8-vm.qcow2"),
    ("PyTorch 25.01", OfferingKind.CONTAINER, "ubuntu-24.04", "12.8", "", 10 * 2**30,
     "nvcr.io/nvidia/pytorch:25.01-py3"),
    ("Rocky Linux 9 + CUDA 12.4 (server)", OfferingKind.BARE_METAL, "rocky-9", "12.4", "550.127",
     8 * 2**30, "https://images.meridian.example/rocky-9-cuda-12.4-server.img"),
]


def seed_images() -> None:
    """The public images, in every region of the fleet; the first of each kind is its default."""
    regions = list(Region.objects.order_by("slug").values_list("slug", flat=True))
    GPUModel.objects.filter(max_cuda_version="").update(max_cuda_version="12.8")
    kinds = set()
    for name, kind, os_name, cuda, driver, size, source in DEMO_IMAGES:
        Image.objects.get_or_create(name=name, tenant=None, defaults={
            "kind": kind, "os": os_name, "cuda_version": cuda, "driver_version": driver, "size_bytes": size,
            "sha256": hashlib.sha256(source.encode()).hexdigest(), "source_url": source, "regions": regions,
            "login_user": "rocky" if os_name.startswith("rocky") else "ubuntu", "is_default": kind not in kinds})
        kinds.add(kind)


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
    for klass, ms, n in (("realtime", 1, 4), ("batch", 5, 4), ("training", 50, 2)):
        rows.append({
            "slug": f"ct-{short}-ts-{klass}-{n}",
            "name": f"Container, time-sliced 1/{n} of {model.name} ({klass}, {ms} ms slices)",
            "kind": OfferingKind.CONTAINER, "gpus_per_unit": 1, "slots_per_gpu": n,
            "isolation_mode": IsolationMode.TIME_SLICED, "time_slice_class": klass, **base,
        })
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
    seed_images()
    for region in Region.objects.all():
        default_storage_classes(region)
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
    seed_demo_storage(Tenant.objects.get(slug="acme"), teams["nlp"], Region.objects.order_by("slug").first())
    seed_demo_usage()
    seed_demo_endpoint()
    return True
