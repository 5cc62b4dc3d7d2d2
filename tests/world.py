"""
The fixture world every API test runs in: two tenants, each with a team and objects of every
tenant-owned kind, and the personas of the role matrix, each with a live read-write token.

Personas: anon, t1_viewer, t1_member, t1_admin, t1_owner, t2_member (another tenant's member),
platform_approver, platform_admin. ``t2_owner`` exists too, to act as tenant B with every right.
"""

from __future__ import annotations

import itertools
import uuid
from dataclasses import dataclass, field
from datetime import timedelta

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from django.db.models import Max
from django.utils import timezone
from rest_framework.test import APIClient

from billing.models import Budget, Commitment, CreditGrant, Invoice, InvoiceCounter, InvoiceLine, UsageRollup
from cloud.catalogue import load_gpu_catalogue
from cloud.fleet import FleetSpec, build_fleet
from cloud.models import GPUModel, Image, Node, Offering, Region
from inference.models import Endpoint
from provisioning.drivers.simulated_devices import trust_simulated_fleet
from provisioning.models import VPC, Instance, Operation, Reservation
from security.audit import audit_record
from security.crypto import encrypt
from security.models import AuditEvent, Incident
from storage.catalogue import default_storage_classes
from storage.drivers.simulated import SimulatedStorage
from storage.models import Checkpoint, CheckpointPolicy, Volume, VolumeSnapshot
from tenants import services
from tenants.choices import PlatformRole, QuotaResource, TeamRole, TenantRole, TokenScope
from tenants.models import (
    APIToken,
    HighPriorityApplication,
    Invitation,
    Membership,
    Notification,
    Quota,
    SSHKey,
    Team,
    TeamMembership,
    Tenant,
    User,
)
from tenants.scoping import Principal
from webhooks.models import WebhookDelivery, WebhookEndpoint

PERSONAS = [
    "anon", "t1_viewer", "t1_member", "t1_admin", "t1_owner", "t2_member", "platform_approver", "platform_admin",
]
TENANT_ROLES = {
    "t1_viewer": ("t1", TenantRole.VIEWER), "t1_member": ("t1", TenantRole.MEMBER),
    "t1_admin": ("t1", TenantRole.ADMIN), "t1_owner": ("t1", TenantRole.OWNER),
    "t2_member": ("t2", TenantRole.MEMBER), "t2_owner": ("t2", TenantRole.OWNER),
}
PLATFORM_ROLES = {"platform_approver": PlatformRole.APPROVER, "platform_admin": PlatformRole.ADMIN}

_counter = itertools.count()


def unique(prefix: str = "x") -> str:
    return f"{prefix}-{next(_counter)}"


class Objects(dict):
    """A tenant's fixture objects by model; a callable stands for one made on first use."""

    def __getitem__(self, model):
        value = super().__getitem__(model)
        if callable(value):
            value = self[model] = value()
        return value

    def values(self):
        return [self[model] for model in self]

    def items(self):
        return [(model, self[model]) for model in self]


@dataclass
class TenantSide:
    tenant: Tenant
    team: Team
    owner: User
    objects: Objects = field(default_factory=Objects)


@dataclass
class World:
    t1: TenantSide
    t2: TenantSide
    users: dict[str, User]
    tokens: dict[str, str]

    def side(self, name: str) -> TenantSide:
        return {"t1": self.t1, "t2": self.t2}[name]

    def client(self, persona: str) -> APIClient:
        client = APIClient()
        if persona != "anon":
            client.credentials(HTTP_AUTHORIZATION=f"Bearer {self.tokens[persona]}")
        return client

    def principal(self, persona: str) -> Principal:
        """The principal a persona's token resolves to, for calling services directly."""
        from tenants.authentication import authenticate_token
        from tenants.principals import principal_for_token

        return principal_for_token(authenticate_token(self.tokens[persona]))


def make_user(email: str, **extra) -> User:
    user = User.objects.create_user(email, **extra)
    return user


def issue_token(user: User, tenant: Tenant | None, scope=TokenScope.READ_WRITE) -> str:
    """A token as its user would make it: read_write, but read for a viewer (whose tokens only read)."""
    if tenant is None:
        principal = Principal(user=user)
    else:
        role = Membership.objects.get(user=user, tenant=tenant).role
        principal = Principal(user=user, tenant=tenant, role=TenantRole(role))
        if role == TenantRole.VIEWER:
            scope = TokenScope.READ
    return services.token_issue(actor=principal, name=unique("token"), scope=scope).secret


def make_tenant_objects(side: TenantSide, member: User) -> None:
    """One object of every tenant-owned kind, owned by ``side``'s tenant."""
    tenant, team = side.tenant, side.team
    side.objects[Team] = team
    side.objects[Membership] = Membership.objects.get(tenant=tenant, user=member)
    side.objects[TeamMembership] = TeamMembership.objects.create(team=team, user=member, role=TeamRole.MEMBER)
    principal = Principal(user=side.owner, tenant=tenant, role=TenantRole.OWNER)
    side.objects[Invitation], _ = services.invitation_create(actor=principal, role=TenantRole.MEMBER)
    side.objects[APIToken] = services.token_issue(actor=principal, name=unique("owner-token")).token
    side.objects[SSHKey] = services.ssh_key_add(actor=principal, name=unique("owner-key"), public_key=ssh_key())
    side.objects[Image] = image(tenant=tenant)
    side.objects[Quota] = Quota.objects.create(tenant=tenant, team=team, resource=QuotaResource.GPUS, limit=16)
    side.objects[Tenant] = tenant
    side.objects[AuditEvent] = AuditEvent.objects.filter(tenant_id=tenant.pk).first()
    reservation = Reservation.objects.create(
        tenant=tenant, name=unique("queued"), offering=vm_offering(), gpu_model=h100(), units=1, gpus=1,
        regions=["us-east-1"], duration=timedelta(hours=1), state="queued",
    )
    side.objects[Reservation] = reservation
    side.objects[Operation] = Operation.objects.create(tenant=tenant, reservation=reservation, kind="place")
    side.objects[Incident] = lambda: Incident.objects.create(  # made on first use: detectors' tests count incidents
        kind="node_failure", tenant_id=tenant.pk, reservation_id=reservation.pk, summary=f"Hardware failure under "
        f"reservation {reservation.name}", evidence={"cause": "world"}, notified_at=timezone.now())
    side.objects[Instance] = lambda: Instance.objects.create(  # made on first use: it needs a fleet
        tenant=tenant, reservation=reservation, node=fleet_node(), index=0, kind="vm", state="active",
        name=unique("vm"), address="vm.world.gpu", ssh_user="ubuntu")
    side.objects[VPC] = lambda: world_vpc(tenant)
    side.objects[Volume] = lambda: world_volume(tenant)
    side.objects[Checkpoint] = lambda: world_checkpoint(side.objects[Volume])
    side.objects[VolumeSnapshot] = lambda: world_snapshot(side.objects[Volume])
    side.objects[Invoice] = lambda: world_invoice(tenant)
    side.objects[Budget] = lambda: Budget.objects.create(tenant=tenant, amount="1000.00", thresholds=[50, 100])
    side.objects[Commitment] = lambda: world_commitment(tenant)
    side.objects[CreditGrant] = lambda: CreditGrant.objects.create(tenant=tenant, amount="500.00", note="Prepayment",
                                                                   granted_at=timezone.now())
    side.objects[Endpoint] = lambda: world_endpoint(tenant)
    side.objects[WebhookEndpoint] = lambda: WebhookEndpoint.objects.create(
        tenant=tenant, url="http://127.0.0.1:9/hooks", event_types=["*"], secret="whsec_world")
    side.objects[WebhookDelivery] = lambda: WebhookDelivery.objects.create(
        tenant=tenant, endpoint=side.objects[WebhookEndpoint], event_id=uuid.uuid4(), event_type="webhook.ping",
        payload={"type": "webhook.ping"}, state="failed", next_attempt_at=timezone.now())
    side.objects[UsageRollup] = lambda: UsageRollup.objects.create(  # tenant-wide work (no team)
        tenant=tenant, period="day", starts_at=timezone.now().replace(hour=0, minute=0, second=0,
                                                                                  microsecond=0),
        resource="gpu", region=Region.objects.get_or_create(slug="us-east-1", defaults={"name": "US East"})[0],
        term="on_demand", quantity=3600, amount="2.49")
    side.objects[HighPriorityApplication] = HighPriorityApplication.objects.create(
        tenant=tenant, team=team, applied_by=member, note="Deadline-bound training runs.",
        snapshot=hp_snapshot(eligible=True))
    side.objects[Notification] = Notification.objects.create(  # for everyone in the tenant, unread
        tenant=tenant, kind="world.welcome", title="Welcome", body="A notification for the whole tenant.")


def hp_snapshot(*, eligible: bool) -> dict:
    """A frozen team record as an application stores it (provisioning.high_priority.services.hp_assess's shape)."""
    rate = 1.0 if eligible else 0.5
    return {
        "computed_at": timezone.now().isoformat(),
        "figures": {"fulfilment_rate_30d": rate, "avg_release_delay_s": 0.0, "unplanned_changes_month": 0},
        "thresholds": {"min_fulfilment": 0.95, "max_avg_release_delay_s": 300.0, "max_unplanned_changes": 2},
        "checks": [
            {"name": "fulfilment_rate_30d", "value": rate, "rule": "above", "threshold": 0.95, "met": eligible},
            {"name": "avg_release_delay_s", "value": 0.0, "rule": "below", "threshold": 300.0, "met": True},
            {"name": "unplanned_changes_month", "value": 0, "rule": "at_most", "threshold": 2, "met": True},
        ],
        "eligible": eligible,
        "reasons": [] if eligible else ["fulfilment rate 50.0% is not above 95.0%"],
    }


def team_record(team: Team, *, used: int = 3, no_show: int = 0, late_s: float = 0.0) -> list[Reservation]:
    """
    Give ``team`` a 30-day record: ``used`` reservations scheduled, run and released ``late_s``
    seconds after their booked end, and ``no_show`` scheduled but never used (straight through the ORM).
    """
    now = timezone.now()
    made = []
    for state in ["released"] * used + ["no_show"] * no_show:
        starts = now - timedelta(hours=3)
        ends = starts + timedelta(hours=1)
        made.append(Reservation.objects.create(
            tenant=team.tenant, team=team, name=unique("record"), offering=vm_offering(), gpu_model=h100(), units=1,
            gpus=1, regions=["us-east-1"], duration=timedelta(hours=1), state=state, scheduled_at=starts,
            starts_at=starts, ends_at=ends,
            released_at=ends + timedelta(seconds=late_s) if state == "released" else None,
        ))
    return made


def world_vpc(tenant: Tenant) -> VPC:
    """An active VPC of ``tenant`` on the test fleet's fabric (subnet 10.20.0.0/24, a P_Key of its own)."""
    fabric = fleet_node().fabric
    return VPC.objects.create(tenant=tenant, fabric=fabric, name=unique("vpc"), cidr="10.20.0.0/24", state="active",
                              pkey=0x100 + VPC.objects.filter(fabric=fabric).count())


def world_volume(tenant: Tenant) -> Volume:
    """An available shared file system of ``tenant`` in us-east-1 (its backend made, as a finished create leaves it)."""
    region, _ = Region.objects.get_or_create(slug="us-east-1", defaults={"name": "US East"})
    shared = next(c for c in default_storage_classes(region) if c.kind == "shared_fs")
    volume = Volume.objects.create(tenant=tenant, name=unique("data"), storage_class=shared, size_gib=100,
                                   target_gib=100, state="available", wrapped_key=encrypt("00" * 32))
    SimulatedStorage().create(ref=volume.backend_ref, kind=shared.kind, size_gib=100)
    return volume


def world_invoice(tenant: Tenant) -> Invoice:
    """A final invoice of ``tenant`` for the month before its last one (last month first), with one line."""
    this = timezone.now().replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    for _ in range(Invoice.objects.filter(tenant=tenant).count()):
        this = (this - timedelta(days=1)).replace(day=1)
    number = (Invoice.objects.aggregate(n=Max("sequence"))["n"] or 0) + 1
    InvoiceCounter.objects.update_or_create(pk=1, defaults={"last": number})  # the sequence goes on from it
    invoice = Invoice.objects.create(
        tenant=tenant, state="final", period_start=(this - timedelta(days=1)).replace(day=1), period_end=this,
        subtotal="24.90", total="24.90", sequence=number, number=f"MER-TEST-{number:06d}", digest="0" * 64,
        finalized_at=this)
    InvoiceLine.objects.create(invoice=invoice, kind="usage", position=1, description="H100 VM", quantity=10,
                               unit="GPU-hour", unit_price="2.49", amount="24.90")
    return invoice


def world_commitment(tenant: Tenant) -> Commitment:
    """A tenant-wide commitment of 2 GPUs for 3 months from next week, its reservation waiting for its start."""
    start = timezone.now() + timedelta(days=7)
    region = Region.objects.get_or_create(slug="us-east-1", defaults={"name": "US East"})[0]
    reservation = Reservation.objects.create(
        tenant=tenant, name=unique("committed"), offering=vm_offering(), gpu_model=h100(), units=2, gpus=2,
        regions=["us-east-1"], requested_start=start, duration=timedelta(days=90), state="queued",
        billing_term="reserved", committed=True)
    return Commitment.objects.create(tenant=tenant, name=reservation.name, offering=vm_offering(), region=region,
                                     gpus=2, months=3, starts_at=start, ends_at=start + timedelta(days=90),
                                     rate="1.990000", reservation=reservation)


def world_snapshot(volume: Volume) -> VolumeSnapshot:
    """An available snapshot of ``volume`` (its backend has it)."""
    taken = VolumeSnapshot.objects.create(tenant_id=volume.tenant_id, volume=volume, name=unique("snap"),
                                          size_gib=volume.size_gib, state="available")
    SimulatedStorage().snapshot(ref=volume.backend_ref, snapshot=taken.backend_ref)
    return taken


def world_checkpoint(volume: Volume) -> Checkpoint:
    """A cold checkpoint of ``volume`` (in its tenant's archive bucket, as a finished demotion leaves it)."""
    region = volume.storage_class.region
    bucket = next(c for c in default_storage_classes(region) if c.kind == "object")
    cold = Volume.objects.create(tenant_id=volume.tenant_id, name=unique("archive"), storage_class=bucket,
                                 size_gib=100, target_gib=100, state="available", wrapped_key=encrypt("00" * 32))
    SimulatedStorage().create(ref=cold.backend_ref, kind="object", size_gib=100)
    CheckpointPolicy.objects.create(tenant_id=volume.tenant_id, volume=volume, cold_volume=cold)
    key = f"checkpoints/{unique('step')}/model.pt"
    SimulatedStorage().write_chunk(ref=cold.backend_ref, key=f"{volume.backend_ref}/{key}", index=0, chunk=1024,
                                   data=b"x" * 1000)
    now = timezone.now()
    return Checkpoint.objects.create(tenant_id=volume.tenant_id, volume=volume, name=key.split("/")[1], state="cold",
                                     files={key: 1000}, size_bytes=1000, written_at=now, last_used_at=now)


def world_endpoint(tenant: Tenant) -> Endpoint:
    """A tenant-wide inference endpoint of one whole-GPU VM replica (its replicas made on demand)."""
    return Endpoint.objects.create(tenant=tenant, name=unique("ep"), offering=vm_offering(), regions=["us-east-1"])


def fleet_node() -> Node:
    """A shared host of the test's fleet (a small one is built if the test has none)."""
    if not Node.objects.filter(pool="shared").exists():
        small_fleet(4)
    return Node.objects.filter(pool="shared").order_by("hostname").first()


def build_world() -> World:
    # Transactional tests flush the tables, the migration-loaded GPU catalogue included.
    load_gpu_catalogue(GPUModel)
    users, sides = {}, {}
    for name in ("t1", "t2"):
        tenant = Tenant.objects.create(name=f"Tenant {name}", slug=unique(f"tenant-{name}"))
        team = Team.objects.create(tenant=tenant, name=f"Team {name}", slug="team")
        sides[name] = TenantSide(tenant=tenant, team=team, owner=None)
    for persona, (side_name, role) in TENANT_ROLES.items():
        user = make_user(f"{persona}-{next(_counter)}@example.com")
        Membership.objects.create(tenant=sides[side_name].tenant, user=user, role=role)
        users[persona] = user
        if role == TenantRole.OWNER:
            sides[side_name].owner = user
    TeamMembership.objects.create(team=sides["t1"].team, user=users["t1_admin"], role=TeamRole.ADMIN)
    for persona, role in PLATFORM_ROLES.items():
        users[persona] = make_user(f"{persona}-{next(_counter)}@example.com", platform_role=role)

    from django.db import transaction

    with transaction.atomic():
        for side in sides.values():
            audit_record(actor=side.owner, action="world.build", target=side.tenant, tenant_id=side.tenant.pk)
    make_tenant_objects(sides["t1"], users["t1_member"])
    make_tenant_objects(sides["t2"], users["t2_member"])
    tokens = {
        persona: issue_token(user, sides[TENANT_ROLES[persona][0]].tenant if persona in TENANT_ROLES else None)
        for persona, user in users.items()
    }
    return World(t1=sides["t1"], t2=sides["t2"], users=users, tokens=tokens)


def small_fleet(nodes: int = 8) -> list[Node]:
    """A one-region fleet for inventory tests (leaf switches, spares, shared hosts included)."""
    load_gpu_catalogue(GPUModel)
    build_fleet(FleetSpec(regions=1, nodes_per_fabric=nodes, spare_ratio=0.25, shared_ratio=0.25))
    trust_simulated_fleet()  # the simulated GPUs attest against the demo device CA and reference values
    return list(Node.objects.all())


def h100() -> GPUModel:
    return GPUModel.objects.get(slug="h100-80gb-sxm")


def vm_offering(gpus_per_unit: int = 1) -> Offering:
    """A VM offering of H100s, one or more GPUs per instance."""
    return Offering.objects.get_or_create(
        slug=f"world-vm-h100x{gpus_per_unit}",
        defaults={"name": f"VM {gpus_per_unit}x H100", "kind": "vm", "gpu_model": h100(),
                  "gpus_per_unit": gpus_per_unit, "price_per_gpu_hour": "2.49"},
    )[0]


def now():
    return timezone.now()


def ssh_key(comment: str = "") -> str:
    """A fresh OpenSSH ed25519 public key line."""
    public = ed25519.Ed25519PrivateKey.generate().public_key()
    line = public.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()
    return f"{line} {comment}".strip()


def image(*, tenant=None, kind="bare_metal", name=None, regions=("us-east-1",), **extra) -> Image:
    """An active image of ``kind`` (a tenant's own, or public when ``tenant`` is None)."""
    fields = {"os": "ubuntu-24.04", "cuda_version": "12.4", "size_bytes": 2**30, "sha256": "a" * 64,
              "source_url": f"https://images.example/{unique('img')}.img", "regions": list(regions)} | extra
    return Image.objects.create(tenant=tenant, kind=kind, name=name or unique("image"), **fields)
