"""
The role matrix: for every API operation, the status each persona gets, and the audit door.

Every (method, route) of /api/v1/ has a row naming all eight personas; ``test_every_route_has_a_row``
fails when a route is added without one. Each cell runs against a fresh world; a successful
change writes exactly one audit event and a refused one writes none.

Columns, in order: anon, t1_viewer, t1_member, t1_admin, t1_owner, t2_member, platform_approver,
platform_admin. The object a detail route acts on belongs to tenant t1.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

import pytest
from django.utils import timezone

from billing.models import Budget, Commitment, CreditGrant, Invoice, Price, SpotPrice, UsageRollup
from cloud.models import GPU, Fabric, GPUModel, Image, Node, Offering, Region
from inference.models import Endpoint
from provisioning.admission import Ask
from provisioning.drivers.simulated_devices import trust_simulated_fleet
from provisioning.models import VPC, Instance, Operation, Reservation
from provisioning.services import reservation_create
from provisioning.staff_actions import reservation_hold
from security.crypto import encrypt
from security.models import (
    AttestationReport,
    AuditEvent,
    Incident,
    OcspStatus,
    ReferenceManifest,
    ReferenceMeasurement,
    RevokedCertificate,
    TrustAnchor,
)
from storage.catalogue import default_storage_classes
from storage.drivers.simulated import SimulatedStorage
from storage.models import Checkpoint, Volume, VolumeSnapshot
from storage.services import volume_attach
from tenants import services
from tenants.choices import TenantRole
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
)
from tenants.scoping import Principal
from tests.routes import SAFE, api_routes
from tests.security.staff_bodies import make_manifests, make_ocsp_statuses, ocsp_body, rim_body
from tests.world import PERSONAS, World, fleet_node, small_fleet, ssh_key, team_record, unique, vm_offering
from webhooks.models import WebhookDelivery, WebhookEndpoint

V1 = "/api/v1"


@dataclass(frozen=True)
class Case:
    codes: str  # eight status codes, in PERSONAS order
    path: Callable[[World], str]
    body: Callable[[World], dict] | None = None

    def expected(self, persona: str) -> int:
        codes = self.codes.split()
        assert len(codes) == len(PERSONAS), f"row has {len(codes)} codes, expected {len(PERSONAS)}"
        return int(codes[PERSONAS.index(persona)])


def fresh_team(w: World) -> str:
    team = Team.objects.create(tenant=w.t1.tenant, name="Disposable", slug=unique("disposable"))
    return f"{V1}/teams/{team.pk}/"


def invitation_body(w: World) -> dict:
    """An open invitation to t1: signed-in personas join with it; anonymous callers must sign in."""
    owner = Principal(user=w.t1.owner, tenant=w.t1.tenant, role=TenantRole.OWNER)
    _, link = services.invitation_create(actor=owner, role=TenantRole.VIEWER)
    return {"token": link.rstrip("/").rsplit("/", 1)[1], "email": f"{unique('joiner')}@example.com",
            "password": "a-long-enough-passphrase"}


def first(model) -> Callable[[World], object]:
    def get(w: World):
        if not model.objects.exists():
            small_fleet(4)
        return model.objects.order_by("pk").first().pk

    return get


def offering(w: World):
    return Offering.objects.get_or_create(
        slug="matrix-offering",
        defaults={"name": "Matrix", "kind": "vm", "gpu_model": GPUModel.objects.get(slug="h100-80gb-sxm"),
                  "gpus_per_unit": 1, "price_per_gpu_hour": "2.00"},
    )[0].pk


def reservation_body(w: World) -> dict:
    small_fleet(4)
    return {"name": "train", "offering": vm_offering().slug, "gpus": 1, "regions": ["us-east-1"],
            "duration_hours": 1}


def commitment_body(w: World) -> dict:
    small_fleet(4)
    return {"name": "year", "offering": vm_offering().slug, "region": "us-east-1", "gpus": 1, "months": 12}


def storage_classes():
    """us-east-1's storage classes (the region made if the world has no fleet)."""
    return default_storage_classes(Region.objects.get_or_create(slug="us-east-1", defaults={"name": "US East"})[0])


def attached_volume(w: World):
    """The world's t1 file system, attached to its queued reservation by the owner."""
    volume = w.t1.objects[Volume]
    volume_attach(actor=w.principal("t1_owner"), volume=volume, reservation=w.t1.objects[Reservation])
    return volume


def object_volume(w: World) -> Volume:
    """An available object volume (a bucket) of t1."""
    bucket = next(c for c in storage_classes() if c.kind == "object")
    volume = Volume.objects.create(tenant=w.t1.tenant, name=unique("bucket"), storage_class=bucket, size_gib=10,
                                   target_gib=10, state="available", wrapped_key=encrypt("00" * 32))
    SimulatedStorage().create(ref=volume.backend_ref, kind="object", size_gib=10)
    return volume


def a_price() -> Price:
    """A price of the VM offering from tomorrow."""
    return Price.objects.create(offering=vm_offering(), term="on_demand", per_gpu_hour="2.00",
                                effective_from=timezone.now() + timedelta(days=1))


def a_spot_price() -> SpotPrice:
    return SpotPrice.objects.create(offering=vm_offering(), region=first_region(), at=timezone.now(),
                                    per_gpu_hour="1.2000", utilization="0.6000")


def first_region() -> Region:
    return Region.objects.get_or_create(slug="us-east-1", defaults={"name": "US East"})[0]


def held_reservation(w: World):
    """The world's queued t1 reservation, held by a platform admin."""
    return reservation_hold(actor=w.principal("platform_admin"), reservation=w.t1.objects[Reservation], note="Wait")


def scheduled_reservation(w: World):
    """A t1 reservation placed at once through the service (the fast path)."""
    small_fleet(4)
    owner = Principal(user=w.t1.owner, tenant=w.t1.tenant, role=TenantRole.OWNER)
    ask = Ask(name="placed", offering=vm_offering(), units=1, regions=(Region.objects.get(slug="us-east-1"),),
              duration=timedelta(hours=1))
    reservation = reservation_create(actor=owner, ask=ask)
    assert reservation.state == "scheduled"
    return reservation


def node_enrolment(w: World) -> dict:
    small_fleet(4)
    leaf = Node.objects.order_by("hostname").first().leaf
    return {"hostname": unique("enrolled-node"), "region": "us-east-1", "fabric": leaf.fabric.slug, "leaf": leaf.name,
            "pool": "bare_metal", "bmc_address": "https://enrolled-bmc.oob.internal/redfish/v1",
            "bmc_username": "meridian", "bmc_password": "s3cret-bmc", "cpu_cores": 112, "ram_gib": 2048,
            "nvme_tb": "30.72", "gpu_model": "h100-80gb-sxm",
            "gpus": [{"index": i, "uuid": f"GPU-{uuid.uuid4()}", "serial": f"SN{uuid.uuid4().hex[:10]}",
                      "pci_bus_id": f"00000000:{0x18 + i:02x}:00.0"} for i in range(8)],
            "ib_port_guids": [f"b83fd2{uuid.uuid4().hex[:10]}" for _ in range(8)]}


def anchor_body(w: World) -> dict:
    from security import device_pki

    _, cert = device_pki.make_root(unique("Vendor GPU Root CA"))
    return {"name": "Vendor root", "certificate_pem": device_pki.cert_to_pem(cert)}


def attestation_row(model):
    """A row of each attestation record: the simulated fleet's trust, a revocation, a report."""
    trust_simulated_fleet()
    if not RevokedCertificate.objects.exists():
        RevokedCertificate.objects.create(issuer="CN=Old GPU CA", serial_number="abc")
    if not AttestationReport.objects.exists():
        AttestationReport.objects.create(node_id=uuid.uuid4(), nonce="0" * 64, status="pass")
    if not ReferenceManifest.objects.exists():
        make_manifests(1)
    if not OcspStatus.objects.exists():
        make_ocsp_statuses(1)
    return model.objects.order_by("pk").first().pk


def hp_apply_body(w: World) -> dict:
    """t1's team, with a record that qualifies and its world application withdrawn (one pending at a time)."""
    HighPriorityApplication.objects.filter(team=w.t1.team).update(state="withdrawn")
    team_record(w.t1.team)
    return {"team": str(w.t1.team.pk), "note": "Deadline-bound training runs."}


def hp_application(w: World) -> str:
    return f"{V1}/high-priority-applications/{w.t1.objects[HighPriorityApplication].pk}/"


def vpc_body(w: World) -> dict:
    fleet_node()
    return {"name": unique("vpc"), "region": "us-east-1"}


def node_in_maintenance(w: World) -> str:
    node_id = first(Node)(w)
    Node.objects.filter(pk=node_id).update(state="maintenance")
    return f"{V1}/nodes/{node_id}/maintenance/"


def available_node(w: World) -> str:
    small_fleet(4)
    node = Node.objects.filter(state="available").order_by("hostname").first()
    return f"{V1}/nodes/{node.pk}/maintenance/"


MATRIX: dict[tuple[str, str], Case] = {
    # ------------------------------------------------------------- anon vie mem adm own t2m apr pad
    ("GET", "api-root"): Case("200 200 200 200 200 200 200 200", lambda w: f"{V1}/"),
    ("GET", "me"): Case("401 200 200 200 200 200 200 200", lambda w: f"{V1}/me/"),
    ("GET", "audit-chain"): Case("401 403 403 403 403 403 403 200", lambda w: f"{V1}/audit-chain/"),
    ("POST", "invitation-accept"): Case(
        "400 403 201 201 201 201 201 201", lambda w: f"{V1}/invitations/accept/", invitation_body),
    ("GET", "tenants-list"): Case("401 200 200 200 200 200 200 200", lambda w: f"{V1}/tenants/"),
    ("POST", "tenants-list"): Case(
        "401 403 403 403 403 403 403 201", lambda w: f"{V1}/tenants/",
        lambda w: {"name": "New", "slug": unique("new"), "owner_email": f"{unique('o')}@example.com"}),
    ("GET", "tenants-detail"): Case("401 200 200 200 200 404 200 200", lambda w: f"{V1}/tenants/{w.t1.tenant.pk}/"),
    ("PATCH", "tenants-detail"): Case(
        "401 403 403 403 200 403 403 403", lambda w: f"{V1}/tenants/{w.t1.tenant.pk}/", lambda w: {"name": "Renamed"}),
    ("GET", "teams-list"): Case("401 200 200 200 200 200 200 200", lambda w: f"{V1}/teams/"),
    ("POST", "teams-list"): Case(
        "401 403 403 201 201 403 403 403", lambda w: f"{V1}/teams/", lambda w: {"name": "T", "slug": unique("t")}),
    ("GET", "teams-detail"): Case("401 200 200 200 200 404 200 200", lambda w: f"{V1}/teams/{w.t1.team.pk}/"),
    ("PATCH", "teams-detail"): Case(
        "401 403 403 200 200 403 403 403", lambda w: f"{V1}/teams/{w.t1.team.pk}/", lambda w: {"name": "Renamed"}),
    ("DELETE", "teams-detail"): Case("401 403 403 204 204 403 403 403", fresh_team),
    ("GET", "memberships-list"): Case("401 200 200 200 200 200 200 200", lambda w: f"{V1}/memberships/"),
    ("GET", "memberships-detail"): Case(
        "401 200 200 200 200 404 200 200", lambda w: f"{V1}/memberships/{w.t1.objects[Membership].pk}/"),
    ("PATCH", "memberships-detail"): Case(
        "401 403 403 200 200 403 403 403", lambda w: f"{V1}/memberships/{w.t1.objects[Membership].pk}/",
        lambda w: {"role": "viewer"}),
    ("DELETE", "memberships-detail"): Case(
        "401 403 403 204 204 403 403 403", lambda w: f"{V1}/memberships/{w.t1.objects[Membership].pk}/"),
    ("GET", "team-memberships-list"): Case("401 200 200 200 200 200 200 200", lambda w: f"{V1}/team-memberships/"),
    ("POST", "team-memberships-list"): Case(
        "401 403 403 201 201 400 403 403", lambda w: f"{V1}/team-memberships/",
        lambda w: {"team": str(w.t1.team.pk), "user": str(w.users["t1_viewer"].pk)}),
    ("GET", "team-memberships-detail"): Case(
        "401 404 200 200 200 404 200 200", lambda w: f"{V1}/team-memberships/{w.t1.objects[TeamMembership].pk}/"),
    ("PATCH", "team-memberships-detail"): Case(
        "401 403 403 200 200 404 403 403", lambda w: f"{V1}/team-memberships/{w.t1.objects[TeamMembership].pk}/",
        lambda w: {"role": "admin"}),
    ("DELETE", "team-memberships-detail"): Case(
        "401 403 403 204 204 404 403 403", lambda w: f"{V1}/team-memberships/{w.t1.objects[TeamMembership].pk}/"),
    ("GET", "invitations-list"): Case("401 403 403 200 200 403 200 200", lambda w: f"{V1}/invitations/"),
    ("POST", "invitations-list"): Case(
        "401 403 403 201 201 403 403 403", lambda w: f"{V1}/invitations/", lambda w: {"role": "member"}),
    ("GET", "invitations-detail"): Case(
        "401 403 403 200 200 403 200 200", lambda w: f"{V1}/invitations/{w.t1.objects[Invitation].pk}/"),
    ("DELETE", "invitations-detail"): Case(
        "401 403 403 204 204 403 403 403", lambda w: f"{V1}/invitations/{w.t1.objects[Invitation].pk}/"),
    ("GET", "images-list"): Case("401 200 200 200 200 200 200 200", lambda w: f"{V1}/images/"),
    ("POST", "images-list"): Case(
        "401 403 201 201 201 201 403 403", lambda w: f"{V1}/images/",
        lambda w: {"name": unique("img"), "kind": "vm", "os": "ubuntu-24.04", "size_bytes": 1, "sha256": "c" * 64,
                   "source_url": "https://images.example/x.qcow2", "regions": []}),
    # The image is t1's own: its members change it, staff read it, platform admins change it.
    ("GET", "images-detail"): Case(
        "401 200 200 200 200 404 200 200", lambda w: f"{V1}/images/{w.t1.objects[Image].pk}/"),
    ("DELETE", "images-detail"): Case(
        "401 403 204 204 204 404 404 204", lambda w: f"{V1}/images/{w.t1.objects[Image].pk}/"),
    ("POST", "images-deprecate"): Case(
        "401 403 200 200 200 404 404 200", lambda w: f"{V1}/images/{w.t1.objects[Image].pk}/deprecate/"),
    ("GET", "ssh-keys-list"): Case("401 200 200 200 200 200 200 200", lambda w: f"{V1}/ssh-keys/"),
    ("POST", "ssh-keys-list"): Case(
        "401 403 201 201 201 201 403 403", lambda w: f"{V1}/ssh-keys/",
        lambda w: {"name": "k", "public_key": ssh_key()}),
    # The owner's own key: its owner and the tenant's admins (and staff) see it; members see only theirs.
    ("GET", "ssh-keys-detail"): Case(
        "401 404 404 200 200 404 200 200", lambda w: f"{V1}/ssh-keys/{w.t1.objects[SSHKey].pk}/"),
    ("DELETE", "ssh-keys-detail"): Case(
        "401 403 404 204 204 404 403 403", lambda w: f"{V1}/ssh-keys/{w.t1.objects[SSHKey].pk}/"),
    ("GET", "api-tokens-list"): Case("401 200 200 200 200 200 200 200", lambda w: f"{V1}/api-tokens/"),
    ("POST", "api-tokens-list"): Case(
        "401 403 201 201 201 201 201 201", lambda w: f"{V1}/api-tokens/", lambda w: {"name": "ci", "scope": "read"}),
    ("GET", "api-tokens-detail"): Case(
        "401 404 404 200 200 404 200 200", lambda w: f"{V1}/api-tokens/{w.t1.objects[APIToken].pk}/"),
    ("DELETE", "api-tokens-detail"): Case(
        "401 403 404 204 204 404 404 204", lambda w: f"{V1}/api-tokens/{w.t1.objects[APIToken].pk}/"),
    ("GET", "quotas-list"): Case("401 200 200 200 200 200 200 200", lambda w: f"{V1}/quotas/"),
    ("POST", "quotas-list"): Case(
        "401 403 403 403 403 403 403 201", lambda w: f"{V1}/quotas/",
        lambda w: {"tenant": str(w.t1.tenant.pk), "resource": "vpcs", "limit": 3}),
    ("GET", "quotas-detail"): Case(  # a team's quota: its members and tenant admins see it
        "401 404 200 200 200 404 200 200", lambda w: f"{V1}/quotas/{w.t1.objects[Quota].pk}/"),
    ("PATCH", "quotas-detail"): Case(
        "401 403 403 403 403 403 403 200", lambda w: f"{V1}/quotas/{w.t1.objects[Quota].pk}/",
        lambda w: {"limit": 24}),
    ("DELETE", "quotas-detail"): Case(
        "401 403 403 403 403 403 403 204", lambda w: f"{V1}/quotas/{w.t1.objects[Quota].pk}/"),
    ("GET", "high-priority-applications-list"): Case(
        "401 200 200 200 200 200 200 200", lambda w: f"{V1}/high-priority-applications/"),
    ("POST", "high-priority-applications-list"): Case(  # viewers and approvers: refused by the service
        "401 403 201 201 201 400 403 201", lambda w: f"{V1}/high-priority-applications/", hp_apply_body),
    ("GET", "high-priority-applications-detail"): Case(  # a team's application: its members and tenant admins
        "401 404 200 200 200 404 200 200", hp_application),
    ("POST", "high-priority-applications-withdraw"): Case(
        "401 403 200 200 200 404 403 403", lambda w: f"{hp_application(w)}withdraw/"),
    ("POST", "high-priority-applications-review"): Case(
        "401 403 403 403 403 403 200 200", lambda w: f"{hp_application(w)}review/",
        lambda w: {"decision": "approve", "note": "The record qualifies."}),
    ("GET", "notifications-list"): Case("401 200 200 200 200 200 200 200", lambda w: f"{V1}/notifications/"),
    ("GET", "notifications-detail"): Case(  # a tenant-wide notification: everyone in t1
        "401 200 200 200 200 404 200 200", lambda w: f"{V1}/notifications/{w.t1.objects[Notification].pk}/"),
    ("POST", "notifications-read"): Case(  # staff read notifications but do not mark them
        "401 403 200 200 200 404 403 403", lambda w: f"{V1}/notifications/{w.t1.objects[Notification].pk}/read/"),
    ("POST", "notifications-read-all"): Case(
        "401 403 200 200 200 200 403 403", lambda w: f"{V1}/notifications/read-all/"),
    ("GET", "audit-events-list"): Case("401 403 403 200 200 403 200 200", lambda w: f"{V1}/audit-events/"),
    ("GET", "audit-events-detail"): Case(
        "401 403 403 200 200 403 200 200", lambda w: f"{V1}/audit-events/{w.t1.objects[AuditEvent].public_id}/"),
    ("GET", "reservations-list"): Case("401 200 200 200 200 200 200 200", lambda w: f"{V1}/reservations/"),
    ("POST", "reservations-list"): Case(
        "401 403 201 201 201 201 403 403", lambda w: f"{V1}/reservations/", reservation_body),
    ("GET", "reservations-detail"): Case(
        "401 200 200 200 200 404 200 200", lambda w: f"{V1}/reservations/{w.t1.objects[Reservation].pk}/"),
    ("POST", "reservations-cancel"): Case(
        "401 403 200 200 200 404 403 403", lambda w: f"{V1}/reservations/{w.t1.objects[Reservation].pk}/cancel/"),
    ("POST", "reservations-release"): Case(
        "401 403 200 200 200 404 403 403", lambda w: f"{V1}/reservations/{scheduled_reservation(w).pk}/release/"),
    ("POST", "reservations-extend"): Case(
        "401 403 200 200 200 404 403 403", lambda w: f"{V1}/reservations/{scheduled_reservation(w).pk}/extend/",
        lambda w: {"hours": 1}),
    # Staff's hand on the queue: platform admins only (the world's t1 reservation is queued).
    ("POST", "reservations-priority"): Case(
        "401 403 403 403 403 403 403 200", lambda w: f"{V1}/reservations/{w.t1.objects[Reservation].pk}/priority/",
        lambda w: {"adjustment": 0.25, "note": "Deadline"}),
    ("POST", "reservations-hold"): Case(
        "401 403 403 403 403 403 403 200", lambda w: f"{V1}/reservations/{w.t1.objects[Reservation].pk}/hold/",
        lambda w: {"note": "Checking with the team"}),
    ("POST", "reservations-let-go"): Case(
        "401 403 403 403 403 403 403 200", lambda w: f"{V1}/reservations/{held_reservation(w).pk}/let-go/",
        lambda w: {"note": "Go ahead"}),
    ("POST", "reservations-operator-cancel"): Case(
        "401 403 403 403 403 403 403 200",
        lambda w: f"{V1}/reservations/{w.t1.objects[Reservation].pk}/operator-cancel/",
        lambda w: {"reason": "Duplicate"}),
    ("POST", "reservations-contact"): Case(
        "401 403 403 403 403 403 403 200", lambda w: f"{V1}/reservations/{w.t1.objects[Reservation].pk}/contact/",
        lambda w: {"message": "Could one GPU do?"}),
    # Inference endpoints: members make and change them, everyone of the tenant reads them and their replicas.
    ("GET", "endpoints-list"): Case("401 200 200 200 200 200 200 200", lambda w: f"{V1}/endpoints/"),
    ("POST", "endpoints-list"): Case(
        "401 403 201 201 201 201 403 403", lambda w: f"{V1}/endpoints/" if small_fleet(4) else "",
        lambda w: {"name": unique("ep"), "share": {"gpu_model": "h100-80gb-sxm"}, "regions": ["us-east-1"]}),
    ("GET", "endpoints-detail"): Case(
        "401 200 200 200 200 404 200 200", lambda w: f"{V1}/endpoints/{w.t1.objects[Endpoint].pk}/"),
    ("PATCH", "endpoints-detail"): Case(
        "401 403 200 200 200 404 403 403", lambda w: f"{V1}/endpoints/{w.t1.objects[Endpoint].pk}/",
        lambda w: {"max_replicas": 6}),
    ("DELETE", "endpoints-detail"): Case(
        "401 403 202 202 202 404 403 403", lambda w: f"{V1}/endpoints/{w.t1.objects[Endpoint].pk}/"),
    ("GET", "endpoints-replicas"): Case(
        "401 200 200 200 200 404 200 200", lambda w: f"{V1}/endpoints/{w.t1.objects[Endpoint].pk}/replicas/"),
    ("GET", "endpoints-decisions"): Case(
        "401 200 200 200 200 404 200 200", lambda w: f"{V1}/endpoints/{w.t1.objects[Endpoint].pk}/decisions/"),
    ("GET", "endpoints-utilization"): Case(
        "401 200 200 200 200 404 200 200", lambda w: f"{V1}/endpoints/{w.t1.objects[Endpoint].pk}/utilization/"),
    # Storage: the classes on sale (everyone signed in reads them), the tenant's volumes.
    ("GET", "storage-classes-list"): Case("401 200 200 200 200 200 200 200", lambda w: f"{V1}/storage-classes/"),
    ("GET", "storage-classes-detail"): Case(
        "401 200 200 200 200 200 200 200", lambda w: f"{V1}/storage-classes/{w.t1.objects[Volume].storage_class_id}/"),
    ("GET", "volumes-list"): Case("401 200 200 200 200 200 200 200", lambda w: f"{V1}/volumes/"),
    ("POST", "volumes-list"): Case(
        "401 403 201 201 201 201 403 403", lambda w: f"{V1}/volumes/" if storage_classes() else "",
        lambda w: {"name": unique("vol"), "storage_class": "us-east-1-shared-fs", "size_gib": 100}),
    ("GET", "volumes-detail"): Case(
        "401 200 200 200 200 404 200 200", lambda w: f"{V1}/volumes/{w.t1.objects[Volume].pk}/"),
    ("DELETE", "volumes-detail"): Case(
        "401 403 202 202 202 404 403 403", lambda w: f"{V1}/volumes/{w.t1.objects[Volume].pk}/"),
    ("POST", "volumes-resize"): Case(
        "401 403 202 202 202 404 403 403", lambda w: f"{V1}/volumes/{w.t1.objects[Volume].pk}/resize/",
        lambda w: {"size_gib": 200}),
    ("POST", "volumes-attach"): Case(
        "401 403 200 200 200 404 403 403", lambda w: f"{V1}/volumes/{w.t1.objects[Volume].pk}/attach/",
        lambda w: {"reservation": str(w.t1.objects[Reservation].pk)}),
    ("POST", "volumes-detach"): Case(
        "401 403 200 200 200 404 403 403", lambda w: f"{V1}/volumes/{attached_volume(w).pk}/detach/",
        lambda w: {"reservation": str(w.t1.objects[Reservation].pk)}),
    ("POST", "volumes-credentials"): Case(
        "401 403 201 201 201 404 403 403", lambda w: f"{V1}/volumes/{object_volume(w).pk}/credentials/"),
    ("GET", "volumes-checkpoint-policy"): Case(  # the world's checkpoint comes with its volume's policy
        "401 200 200 200 200 404 200 200",
        lambda w: f"{V1}/volumes/{w.t1.objects[Checkpoint].volume_id}/checkpoint-policy/"),
    ("PUT", "volumes-checkpoint-policy"): Case(
        "401 403 200 200 200 404 403 403", lambda w: f"{V1}/volumes/{w.t1.objects[Volume].pk}/checkpoint-policy/",
        lambda w: {"cold_volume": str(object_volume(w).pk), "keep_hot": 3}),
    ("GET", "snapshots-list"): Case("401 200 200 200 200 200 200 200", lambda w: f"{V1}/snapshots/"),
    ("POST", "snapshots-list"): Case(
        "401 403 201 201 201 400 403 403", lambda w: f"{V1}/snapshots/",
        lambda w: {"volume": str(w.t1.objects[Volume].pk), "name": unique("snap")}),
    ("GET", "snapshots-detail"): Case(
        "401 200 200 200 200 404 200 200", lambda w: f"{V1}/snapshots/{w.t1.objects[VolumeSnapshot].pk}/"),
    ("DELETE", "snapshots-detail"): Case(
        "401 403 202 202 202 404 403 403", lambda w: f"{V1}/snapshots/{w.t1.objects[VolumeSnapshot].pk}/"),
    ("GET", "checkpoints-list"): Case("401 200 200 200 200 200 200 200", lambda w: f"{V1}/checkpoints/"),
    ("GET", "checkpoints-detail"): Case(
        "401 200 200 200 200 404 200 200", lambda w: f"{V1}/checkpoints/{w.t1.objects[Checkpoint].pk}/"),
    ("POST", "checkpoints-restore"): Case(
        "401 403 202 202 202 404 403 403", lambda w: f"{V1}/checkpoints/{w.t1.objects[Checkpoint].pk}/restore/",
        lambda w: {}),
    ("GET", "reservations-receipts"): Case(
        "401 200 200 200 200 404 200 200", lambda w: f"{V1}/reservations/{w.t1.objects[Reservation].pk}/receipts/"),
    ("GET", "reservations-score"): Case(
        "401 200 200 200 200 404 200 200", lambda w: f"{V1}/reservations/{w.t1.objects[Reservation].pk}/score/"),
    ("GET", "reservations-telemetry"): Case(
        "401 200 200 200 200 404 200 200", lambda w: f"{V1}/reservations/{w.t1.objects[Reservation].pk}/telemetry/"),
    ("GET", "reservations-usage"): Case(
        "401 200 200 200 200 404 200 200", lambda w: f"{V1}/reservations/{w.t1.objects[Reservation].pk}/usage/"),
    ("GET", "operations-list"): Case("401 200 200 200 200 200 200 200", lambda w: f"{V1}/operations/"),
    ("GET", "operations-detail"): Case(
        "401 200 200 200 200 404 200 200", lambda w: f"{V1}/operations/{w.t1.objects[Operation].pk}/"),
    ("GET", "instances-list"): Case("401 200 200 200 200 200 200 200", lambda w: f"{V1}/instances/"),
    ("GET", "instances-detail"): Case(
        "401 200 200 200 200 404 200 200", lambda w: f"{V1}/instances/{w.t1.objects[Instance].pk}/"),
    ("GET", "instances-console"): Case(  # what a script printed may be secret: members and above
        "401 403 200 200 200 404 200 200", lambda w: f"{V1}/instances/{w.t1.objects[Instance].pk}/console/"),
    ("GET", "vpcs-list"): Case("401 200 200 200 200 200 200 200", lambda w: f"{V1}/vpcs/"),
    ("POST", "vpcs-list"): Case("401 403 201 201 201 201 403 403", lambda w: f"{V1}/vpcs/", vpc_body),
    ("GET", "vpcs-detail"): Case("401 200 200 200 200 404 200 200", lambda w: f"{V1}/vpcs/{w.t1.objects[VPC].pk}/"),
    ("DELETE", "vpcs-detail"): Case(
        "401 403 202 202 202 404 403 403", lambda w: f"{V1}/vpcs/{w.t1.objects[VPC].pk}/"),
    ("GET", "vpcs-members"): Case(
        "401 200 200 200 200 404 200 200", lambda w: f"{V1}/vpcs/{w.t1.objects[VPC].pk}/members/"),
    ("GET", "vpcs-isolation-report"): Case(
        "401 200 200 200 200 404 200 200", lambda w: f"{V1}/vpcs/{w.t1.objects[VPC].pk}/isolation-report/"),
    ("GET", "regions-list"): Case("401 200 200 200 200 200 200 200", lambda w: f"{V1}/regions/"),
    ("POST", "regions-list"): Case(
        "401 403 403 403 403 403 403 201", lambda w: f"{V1}/regions/",
        lambda w: {"slug": unique("region"), "name": "New region"}),
    ("GET", "regions-detail"): Case(
        "401 200 200 200 200 200 200 200", lambda w: f"{V1}/regions/{first(Region)(w)}/"),
    ("PATCH", "regions-detail"): Case(
        "401 403 403 403 403 403 403 200", lambda w: f"{V1}/regions/{first(Region)(w)}/", lambda w: {"name": "R"}),
    ("GET", "gpu-models-list"): Case("401 200 200 200 200 200 200 200", lambda w: f"{V1}/gpu-models/"),
    ("POST", "gpu-models-list"): Case(
        "401 403 403 403 403 403 403 201", lambda w: f"{V1}/gpu-models/",
        lambda w: {"slug": unique("gpu"), "name": "Next GPU", "memory_gib": 96, "memory_bandwidth_tbs": "4.00",
                   "fp16_tflops": "500.0", "tdp_watts": 600}),
    ("GET", "gpu-models-detail"): Case(
        "401 200 200 200 200 200 200 200", lambda w: f"{V1}/gpu-models/{first(GPUModel)(w)}/"),
    ("PATCH", "gpu-models-detail"): Case(
        "401 403 403 403 403 403 403 200", lambda w: f"{V1}/gpu-models/{first(GPUModel)(w)}/",
        lambda w: {"tdp_watts": 450}),
    ("GET", "prices-list"): Case("401 200 200 200 200 200 200 200", lambda w: f"{V1}/prices/"),
    ("POST", "prices-list"): Case(
        "401 403 403 403 403 403 403 201", lambda w: f"{V1}/prices/",
        lambda w: {"offering": vm_offering().slug, "term": "on_demand", "per_gpu_hour": "2.10",
                   "effective_from": (timezone.now() + timedelta(days=1, seconds=len(unique("t")))).isoformat()}),
    ("GET", "prices-detail"): Case("401 200 200 200 200 200 200 200", lambda w: f"{V1}/prices/{a_price().pk}/"),
    ("GET", "spot-prices-list"): Case("401 200 200 200 200 200 200 200", lambda w: f"{V1}/spot-prices/"),
    ("GET", "spot-prices-detail"): Case(
        "401 200 200 200 200 200 200 200", lambda w: f"{V1}/spot-prices/{a_spot_price().pk}/"),
    ("GET", "usage-list"): Case("401 200 200 200 200 200 200 200", lambda w: f"{V1}/usage/"),
    ("GET", "usage-detail"): Case(
        "401 200 200 200 200 404 200 200", lambda w: f"{V1}/usage/{w.t1.objects[UsageRollup].pk}/"),
    ("GET", "budgets-list"): Case("401 200 200 200 200 200 200 200", lambda w: f"{V1}/budgets/"),
    ("POST", "budgets-list"): Case(
        "401 403 403 201 201 403 403 403", lambda w: f"{V1}/budgets/",
        lambda w: {"team": str(w.t1.team.pk), "amount": "500.00"}),
    ("GET", "budgets-detail"): Case(
        "401 200 200 200 200 404 200 200", lambda w: f"{V1}/budgets/{w.t1.objects[Budget].pk}/"),
    ("PATCH", "budgets-detail"): Case(
        "401 403 403 200 200 403 403 403", lambda w: f"{V1}/budgets/{w.t1.objects[Budget].pk}/",
        lambda w: {"amount": "2000.00"}),
    ("DELETE", "budgets-detail"): Case(
        "401 403 403 204 204 403 403 403", lambda w: f"{V1}/budgets/{w.t1.objects[Budget].pk}/"),
    ("GET", "commitments-list"): Case("401 200 200 200 200 200 200 200", lambda w: f"{V1}/commitments/"),
    ("POST", "commitments-list"): Case(
        "401 403 403 201 201 403 403 403", lambda w: f"{V1}/commitments/", commitment_body),
    ("GET", "commitments-detail"): Case(
        "401 200 200 200 200 404 200 200", lambda w: f"{V1}/commitments/{w.t1.objects[Commitment].pk}/"),
    ("DELETE", "commitments-detail"): Case(
        "401 403 403 204 204 403 403 403", lambda w: f"{V1}/commitments/{w.t1.objects[Commitment].pk}/"),
    ("GET", "credits-list"): Case("401 403 403 200 200 403 200 200", lambda w: f"{V1}/credits/"),
    ("POST", "credits-list"): Case(
        "401 403 403 403 403 403 403 201", lambda w: f"{V1}/credits/",
        lambda w: {"tenant": w.t1.tenant.slug, "amount": "1000.00", "note": "Prepayment"}),
    ("GET", "credits-detail"): Case(
        "401 403 403 200 200 403 200 200", lambda w: f"{V1}/credits/{w.t1.objects[CreditGrant].pk}/"),
    ("GET", "credits-balance"): Case("401 403 403 200 200 403 400 400", lambda w: f"{V1}/credits/balance/"),
    ("GET", "webhooks-list"): Case("401 403 403 200 200 403 200 200", lambda w: f"{V1}/webhooks/"),
    ("POST", "webhooks-list"): Case(
        "401 403 403 201 201 403 403 403", lambda w: f"{V1}/webhooks/",
        lambda w: {"url": "http://127.0.0.1:9/hooks", "event_types": ["reservation.*"]}),
    ("GET", "webhooks-event-types"): Case("401 403 403 200 200 403 200 200", lambda w: f"{V1}/webhooks/event-types/"),
    ("GET", "webhooks-detail"): Case(
        "401 403 403 200 200 403 200 200", lambda w: f"{V1}/webhooks/{w.t1.objects[WebhookEndpoint].pk}/"),
    ("PATCH", "webhooks-detail"): Case(
        "401 403 403 200 200 403 403 403", lambda w: f"{V1}/webhooks/{w.t1.objects[WebhookEndpoint].pk}/",
        lambda w: {"description": "CI receiver"}),
    ("DELETE", "webhooks-detail"): Case(
        "401 403 403 204 204 403 403 403", lambda w: f"{V1}/webhooks/{w.t1.objects[WebhookEndpoint].pk}/"),
    ("POST", "webhooks-rotate-secret"): Case(
        "401 403 403 200 200 403 403 403",
        lambda w: f"{V1}/webhooks/{w.t1.objects[WebhookEndpoint].pk}/rotate-secret/"),
    ("POST", "webhooks-ping"): Case(
        "401 403 403 202 202 403 403 403", lambda w: f"{V1}/webhooks/{w.t1.objects[WebhookEndpoint].pk}/ping/"),
    ("GET", "webhook-deliveries-list"): Case(
        "401 403 403 200 200 403 200 200", lambda w: f"{V1}/webhook-deliveries/"),
    ("GET", "webhook-deliveries-detail"): Case(
        "401 403 403 200 200 403 200 200", lambda w: f"{V1}/webhook-deliveries/{w.t1.objects[WebhookDelivery].pk}/"),
    ("POST", "webhook-deliveries-redeliver"): Case(
        "401 403 403 202 202 403 403 403",
        lambda w: f"{V1}/webhook-deliveries/{w.t1.objects[WebhookDelivery].pk}/redeliver/"),
    ("GET", "invoices-list"): Case("401 403 403 200 200 403 200 200", lambda w: f"{V1}/invoices/"),
    ("GET", "invoices-detail"): Case(
        "401 403 403 200 200 403 200 200", lambda w: f"{V1}/invoices/{w.t1.objects[Invoice].pk}/"),
    ("PATCH", "invoices-detail"): Case(  # reaches the rule: a final invoice never changes
        "401 403 403 409 409 403 403 403", lambda w: f"{V1}/invoices/{w.t1.objects[Invoice].pk}/",
        lambda w: {"total": "0.00"}),
    ("GET", "invoices-current"): Case("401 403 403 200 200 403 400 400", lambda w: f"{V1}/invoices/current/"),
    ("GET", "invoices-csv"): Case(
        "401 403 403 200 200 403 200 200", lambda w: f"{V1}/invoices/{w.t1.objects[Invoice].pk}/csv/"),
    ("POST", "invoices-credit-notes"): Case(
        "401 403 403 403 403 403 403 201", lambda w: f"{V1}/invoices/{w.t1.objects[Invoice].pk}/credit-notes/",
        lambda w: {"amount": "1.00", "reason": "Goodwill"}),
    ("GET", "offerings-list"): Case("401 200 200 200 200 200 200 200", lambda w: f"{V1}/offerings/"),
    ("POST", "offerings-list"): Case(
        "401 403 403 403 403 403 403 201", lambda w: f"{V1}/offerings/",
        lambda w: {"slug": unique("offer"), "name": "Offer", "kind": "container", "gpu_model": "h200-141gb-sxm",
                   "gpus_per_unit": 1, "price_per_gpu_hour": "3.10"}),
    ("GET", "offerings-detail"): Case("401 200 200 200 200 200 200 200", lambda w: f"{V1}/offerings/{offering(w)}/"),
    ("PATCH", "offerings-detail"): Case(
        "401 403 403 403 403 403 403 200", lambda w: f"{V1}/offerings/{offering(w)}/",
        lambda w: {"price_per_gpu_hour": "2.20"}),
    ("GET", "fabrics-list"): Case("401 403 403 403 403 403 200 200", lambda w: f"{V1}/fabrics/"),
    ("GET", "fabrics-detail"): Case("401 403 403 403 403 403 200 200", lambda w: f"{V1}/fabrics/{first(Fabric)(w)}/"),
    ("GET", "nodes-list"): Case("401 403 403 403 403 403 200 200", lambda w: f"{V1}/nodes/"),
    ("GET", "nodes-detail"): Case("401 403 403 403 403 403 200 200", lambda w: f"{V1}/nodes/{first(Node)(w)}/"),
    ("POST", "nodes-maintenance"): Case(
        "401 403 403 403 403 403 403 200", available_node, lambda w: {"reason": "replace a fan"}),
    ("DELETE", "nodes-maintenance"): Case("401 403 403 403 403 403 403 200", node_in_maintenance),
    ("POST", "nodes-list"): Case("401 403 403 403 403 403 403 201", lambda w: f"{V1}/nodes/", node_enrolment),
    ("POST", "nodes-validate"): Case(
        "401 403 403 403 403 403 403 202", lambda w: available_node(w).replace("maintenance", "validate")),
    ("GET", "nodes-steps"): Case(
        "401 403 403 403 403 403 200 200", lambda w: available_node(w).replace("maintenance", "steps")),
    ("GET", "nodes-validations"): Case(
        "401 403 403 403 403 403 200 200", lambda w: available_node(w).replace("maintenance", "validations")),
    ("GET", "gpus-list"): Case("401 403 403 403 403 403 200 200", lambda w: f"{V1}/gpus/"),
    ("GET", "gpus-detail"): Case("401 403 403 403 403 403 200 200", lambda w: f"{V1}/gpus/{first(GPU)(w)}/"),
    ("GET", "gpus-telemetry"): Case(
        "401 403 403 403 403 403 200 200", lambda w: f"{V1}/gpus/{first(GPU)(w)}/telemetry/"),
    ("GET", "trust-anchors-list"): Case("401 403 403 403 403 403 200 200", lambda w: f"{V1}/trust-anchors/"),
    ("POST", "trust-anchors-list"): Case("401 403 403 403 403 403 403 201", lambda w: f"{V1}/trust-anchors/",
                                         anchor_body),
    ("GET", "trust-anchors-detail"): Case(
        "401 403 403 403 403 403 200 200", lambda w: f"{V1}/trust-anchors/{attestation_row(TrustAnchor)}/"),
    ("GET", "revocations-list"): Case("401 403 403 403 403 403 200 200", lambda w: f"{V1}/revocations/"),
    ("POST", "revocations-list"): Case("401 403 403 403 403 403 403 201", lambda w: f"{V1}/revocations/",
                                       lambda w: {"issuer": "CN=Some GPU CA", "serial_number": "0x1f2e"}),
    ("GET", "revocations-detail"): Case(
        "401 403 403 403 403 403 200 200", lambda w: f"{V1}/revocations/{attestation_row(RevokedCertificate)}/"),
    ("GET", "reference-measurements-list"): Case(
        "401 403 403 403 403 403 200 200", lambda w: f"{V1}/reference-measurements/"),
    ("POST", "reference-measurements-list"): Case(
        "401 403 403 403 403 403 403 201", lambda w: f"{V1}/reference-measurements/",
        lambda w: {"gpu_model": "h100-80gb-sxm", "vbios_version": unique("vbios"), "driver_version": "570.1",
                   "measurements": {"0": "a" * 96, "1": "b" * 96}}),
    ("GET", "reference-measurements-detail"): Case(
        "401 403 403 403 403 403 200 200",
        lambda w: f"{V1}/reference-measurements/{attestation_row(ReferenceMeasurement)}/"),
    ("GET", "reference-manifests-list"): Case(
        "401 403 403 403 403 403 200 200", lambda w: f"{V1}/reference-manifests/"),
    ("POST", "reference-manifests-list"): Case(
        "401 403 403 403 403 403 403 201", lambda w: f"{V1}/reference-manifests/", lambda w: rim_body()),
    ("GET", "reference-manifests-detail"): Case(
        "401 403 403 403 403 403 200 200",
        lambda w: f"{V1}/reference-manifests/{attestation_row(ReferenceManifest)}/"),
    ("GET", "ocsp-statuses-list"): Case("401 403 403 403 403 403 200 200", lambda w: f"{V1}/ocsp-statuses/"),
    ("POST", "ocsp-statuses-list"): Case(
        "401 403 403 403 403 403 403 201", lambda w: f"{V1}/ocsp-statuses/", lambda w: ocsp_body()),
    ("GET", "ocsp-statuses-detail"): Case(
        "401 403 403 403 403 403 200 200", lambda w: f"{V1}/ocsp-statuses/{attestation_row(OcspStatus)}/"),
    ("GET", "attestation-reports-list"): Case(
        "401 403 403 403 403 403 200 200", lambda w: f"{V1}/attestation-reports/"),
    ("GET", "attestation-reports-detail"): Case(
        "401 403 403 403 403 403 200 200", lambda w: f"{V1}/attestation-reports/{attestation_row(AttestationReport)}/"),
    # SLA per tenant and month: the tenant's own (every role), staff any tenant's.
    ("GET", "sla-list"): Case("401 200 200 200 200 200 200 200", lambda w: f"{V1}/sla/"),
    ("GET", "sla-detail"): Case("401 200 200 200 200 404 200 200", lambda w: f"{V1}/sla/{w.t1.tenant.pk}/"),
    # Incidents: a tenant reads its own, staff all; platform admins respond (docs/incidents.md).
    ("GET", "incidents-list"): Case("401 200 200 200 200 200 200 200", lambda w: f"{V1}/incidents/"),
    ("GET", "incidents-detail"): Case(
        "401 200 200 200 200 404 200 200", lambda w: f"{V1}/incidents/{w.t1.objects[Incident].pk}/"),
    ("POST", "incidents-acknowledge"): Case(
        "401 403 403 403 403 403 403 200", lambda w: f"{V1}/incidents/{w.t1.objects[Incident].pk}/acknowledge/"),
    ("POST", "incidents-assign"): Case(
        "401 403 403 403 403 403 403 200", lambda w: f"{V1}/incidents/{w.t1.objects[Incident].pk}/assign/",
        lambda w: {"assignee": w.users["platform_admin"].email}),
    ("POST", "incidents-resolve"): Case(
        "401 403 403 403 403 403 403 200", lambda w: f"{V1}/incidents/{w.t1.objects[Incident].pk}/resolve/",
        lambda w: {"note": "Replaced the PSU."}),
}


def test_every_route_has_a_row():
    """Every API operation is in the matrix, and the matrix names no route that does not exist."""
    routes = {route.key for route in api_routes()}
    assert routes - MATRIX.keys() == set(), "routes without a row in the role matrix"
    assert MATRIX.keys() - routes == set(), "matrix rows for routes that do not exist"


@pytest.mark.parametrize("persona", PERSONAS)
@pytest.mark.parametrize("key", sorted(MATRIX), ids=lambda key: f"{key[0]} {key[1]}")
def test_role_matrix(world, persona, key):
    """
    The persona gets exactly the status in its cell; a change writes one audit event in the
    persona's name (what the system does as a consequence is audited as the system's), a refusal none.
    """
    method, _name = key
    case = MATRIX[key]
    path = case.path(world)
    body = case.body(world) if case.body else None
    by_people = AuditEvent.objects.exclude(actor_id=None, token_id=None)
    events = by_people.count()
    response = getattr(world.client(persona), method.lower())(path, body, format="json")
    expected = case.expected(persona)
    assert response.status_code == expected, (
        f"{persona} {method} {path}: {response.status_code}, expected {expected}: {response.content[:300]!r}"
    )
    if response.status_code >= 400:
        assert response.json()["errors"][0]["code"], "every refusal carries a machine-readable code"
    if method not in SAFE:
        written = by_people.count() - events
        assert written == (1 if response.status_code < 300 else 0), f"{written} audit events for {persona} {method}"

