"""
A query-count guard on every list endpoint of the router: a page of 20 rows costs the same number
of queries as a page of 2 (no N+1). A route whose model has no row-maker here fails, so a route
added later cannot slip past the guard.
"""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Callable
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from billing.models import Budget, Commitment, CreditGrant, Invoice, Price, SpotPrice, UsageRollup
from cloud.choices import NodePool, NodeState, OfferingKind
from cloud.fleet import HGX_PCI_BUS_IDS
from cloud.models import GPU, Fabric, GPUModel, Image, Node, Offering, Region, Switch
from config.api_router import router
from inference.models import Endpoint, Replica
from provisioning.models import VPC, Instance, Operation, PortMembership, Reservation
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
from storage.models import Checkpoint, StorageClass, Volume, VolumeAttachment, VolumeSnapshot
from tenants.choices import QuotaResource, TeamRole, TenantRole
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
    secret_digest,
)
from tests.security.staff_bodies import make_manifests, make_ocsp_statuses
from tests.world import (
    World,
    fleet_node,
    h100,
    hp_snapshot,
    image,
    make_user,
    unique,
    vm_offering,
    world_checkpoint,
    world_commitment,
    world_endpoint,
    world_invoice,
    world_snapshot,
    world_volume,
)
from web.api.base import PlatformViewSet
from webhooks.models import WebhookAttempt, WebhookDelivery, WebhookEndpoint

SMALL, LARGE = 2, 20

#
# Row-makers: ``make(world, n)`` adds n rows of the model visible to the route's caller.
#


def _team(world: World) -> Team:
    return Team.objects.create(tenant=world.t1.tenant, name=unique("Team"), slug=unique("team"))


def _member(world: World):
    user = make_user(f"{unique('member')}@example.com")
    Membership.objects.create(tenant=world.t1.tenant, user=user, role=TenantRole.MEMBER)
    return user


def make_tenants(world, n):
    for _ in range(n):
        Tenant.objects.create(name=unique("Tenant"), slug=unique("tenant"))


def make_teams(world, n):
    for _ in range(n):
        _team(world)


def make_memberships(world, n):
    for _ in range(n):
        _member(world)


def make_team_memberships(world, n):
    for _ in range(n):
        TeamMembership.objects.create(team=world.t1.team, user=_member(world), role=TeamRole.MEMBER)


def make_invitations(world, n):
    for _ in range(n):
        Invitation.objects.create(
            tenant=world.t1.tenant, team=world.t1.team, email=f"{unique('invitee')}@example.com",
            role=TenantRole.MEMBER, digest=secret_digest(secrets.token_urlsafe(32)), created_by=world.t1.owner,
            expires_at=timezone.now() + timedelta(days=7),
        )


def make_api_tokens(world, n):
    for _ in range(n):
        APIToken.objects.create(
            user=world.users["t1_member"], tenant=world.t1.tenant, team=world.t1.team, name=unique("token"),
            prefix=secrets.token_hex(6), digest=secret_digest(secrets.token_urlsafe(32)),
        )


def make_ssh_keys(world, n):
    """Keys of members and shared ones, as an owner lists them."""
    for i in range(n):
        SSHKey.objects.create(tenant=world.t1.tenant, user=world.users["t1_member"] if i % 2 else None,
                              name=unique("key"), kind="ssh-ed25519", bits=256, public_key=f"ssh-ed25519 AAAA{i}",
                              fingerprint=f"SHA256:{secrets.token_hex(16)}")


def make_images(world, n):
    """Public images and the tenant's own, as a tenant lists them."""
    for i in range(n):
        image(tenant=world.t1.tenant if i % 2 else None, kind=("bare_metal", "vm", "container")[i % 3])


def make_quotas(world, n):
    for i in range(n):
        Quota.objects.create(tenant=world.t1.tenant, team=_team(world), resource=QuotaResource.GPUS,
                             gpu_model=h100() if i % 2 else None, limit=8 + i)


def make_hp_applications(world, n):
    """Reviewed applications of fresh teams (one pending per team), by members and reviewers of their own."""
    states = ["approved", "rejected", "withdrawn", "revoked", "expired"]
    for i in range(n):
        HighPriorityApplication.objects.create(
            tenant=world.t1.tenant, team=_team(world), applied_by=_member(world), note="Deadline.",
            state=states[i % len(states)], snapshot=hp_snapshot(eligible=bool(i % 2)),
            reviewed_by=make_user(f"{unique('reviewer')}@example.com"), review_note="Checked.",
            reviewed_at=timezone.now(),
        )


def make_notifications(world, n):
    """Notifications the owner sees: its own, the tenant's, and a team's."""
    owner, team = world.t1.owner, world.t1.team
    Notification.objects.bulk_create([
        Notification(tenant=world.t1.tenant, user=owner if i % 3 == 0 else None, team=team if i % 3 == 1 else None,
                     kind="test.notice", title=f"Notice {i}", body="Something happened.") for i in range(n)])


def make_audit_events(world, n):
    for i in range(n):
        AuditEvent.objects.create(actor_id=world.t1.owner.pk, actor_email=world.t1.owner.email,
                                  tenant_id=world.t1.tenant.pk, action="test.event", target_type="tenants.team",
                                  target_id=str(world.t1.team.pk), after={"i": i})


def make_regions(world, n):
    for _ in range(n):
        slug = unique("region")
        Region.objects.create(slug=slug, name=slug.title())


def make_gpu_models(world, n):
    for _ in range(n):
        GPUModel.objects.create(slug=unique("gpu"), name=unique("GPU"), memory_gib=48, memory_bandwidth_tbs="0.86",
                                fp16_tflops="362.0", tdp_watts=350, mig_max_instances=7)


def make_offerings(world, n):
    models = list(GPUModel.objects.order_by("slug"))
    for i in range(n):
        kind = [OfferingKind.BARE_METAL, OfferingKind.VM, OfferingKind.CONTAINER][i % 3]
        Offering.objects.create(
            slug=unique("offering"), name=unique("Offering"), kind=kind, gpu_model=models[i % len(models)],
            gpus_per_unit=8 if kind == OfferingKind.BARE_METAL else 1,
            slots_per_gpu=7 if kind == OfferingKind.CONTAINER else 1, price_per_gpu_hour="2.5000",
        )


def _region() -> Region:
    return Region.objects.create(slug=unique("region"), name="Region")


def _fabric(region: Region | None = None) -> Fabric:
    region = region or _region()
    return Fabric.objects.create(region=region, name=unique("Fabric"), slug=unique("ib"))


def _node(fabric: Fabric | None = None, pool=NodePool.BARE_METAL) -> Node:
    fabric = fabric or _fabric()
    leaf = Switch.objects.create(fabric=fabric, name=unique("leaf"), tier="leaf")
    hostname = unique("node")
    return Node.objects.create(
        hostname=hostname, region=fabric.region, fabric=fabric, leaf=leaf, pool=pool,
        bmc_address=f"https://{hostname}-bmc/redfish/v1", bmc_username="meridian", bmc_password=secrets.token_hex(8),
        cpu_cores=112, ram_gib=2048, nvme_tb="30.72", gpus_installed=8,
        state=NodeState.IN_SERVICE if pool == NodePool.SHARED else NodeState.AVAILABLE,
    )


def make_fabrics(world, n):
    region = _region()
    for _ in range(n):
        fabric = _fabric(region)
        Switch.objects.create(fabric=fabric, name=unique("leaf"), tier="leaf")
        Switch.objects.create(fabric=fabric, name=unique("spine"), tier="spine")
        _node(fabric)


def make_nodes(world, n):
    fabric = _fabric()
    for i in range(n):
        node = _node(fabric, NodePool.SHARED if i % 2 else NodePool.BARE_METAL)
        _gpus(node, 2)


def _gpus(node: Node, count: int) -> None:
    model = h100()
    for index in range(count):
        GPU.objects.create(node=node, index=index, uuid=f"GPU-{unique('u')}", serial=unique("serial"),
                           pci_bus_id=HGX_PCI_BUS_IDS[index], model=model, memory_mib=model.memory_gib * 1024)


def make_gpus(world, n):
    fabric = _fabric()
    node = None
    for i in range(n):
        if i % 8 == 0:
            node = _node(fabric)
        GPU.objects.create(node=node, index=i % 8, uuid=f"GPU-{unique('u')}", serial=unique("serial"),
                           pci_bus_id=HGX_PCI_BUS_IDS[i % 8], model=h100(), memory_mib=81920)


def make_reservations(world, n):
    for _ in range(n):
        Reservation.objects.create(
            tenant=world.t1.tenant, team=world.t1.team, name=unique("r"), offering=vm_offering(), gpu_model=h100(),
            units=1, gpus=1, regions=["us-east-1"], duration=timedelta(hours=1), state="queued",
        )


def make_operations(world, n):
    make_reservations(world, n)
    for reservation in Reservation.objects.filter(tenant=world.t1.tenant).order_by("-submitted_at")[:n]:
        Operation.objects.create(tenant=world.t1.tenant, reservation=reservation, kind="place")


def make_instances(world, n):
    make_reservations(world, n)
    node = fleet_node()
    for i, reservation in enumerate(Reservation.objects.filter(tenant=world.t1.tenant).order_by("-submitted_at")[:n]):
        Instance.objects.create(tenant=world.t1.tenant, reservation=reservation, node=node, index=0, kind="vm",
                                state="active", name=f"vm-{i}-{secrets.token_hex(3)}")


def make_storage_classes(world, n):
    region, _ = Region.objects.get_or_create(slug="us-east-1", defaults={"name": "US East"})
    base = StorageClass.objects.count()
    StorageClass.objects.bulk_create(StorageClass(
        slug=f"bench-class-{base + i}", name=f"Class {base + i}", kind="block", region=region,
        price_per_gib_month="0.1000") for i in range(n))


def make_volumes(world, n):
    """File systems of t1, each attached to the world's reservation (the list shows live attachments)."""
    reservation = world.t1.objects[Reservation]
    for _ in range(n):
        volume = world_volume(world.t1.tenant)
        VolumeAttachment.objects.create(tenant=world.t1.tenant, volume=volume, reservation=reservation,
                                        exclusive=False, mount_path=f"/mnt/{volume.name}")


def make_checkpoints(world, n):
    """Checkpoints of t1's file systems, each with its volume (the list names it)."""
    for _ in range(n):
        world_checkpoint(world_volume(world.t1.tenant))


def make_snapshots(world, n):
    """Snapshots of t1's file systems (the list names each one's volume)."""
    for _ in range(n):
        world_snapshot(world_volume(world.t1.tenant))


def make_prices(world, n):
    offering = vm_offering()
    Price.objects.bulk_create(Price(offering=offering, term="on_demand", per_gpu_hour="2.00",
                                    effective_from=timezone.now() + timedelta(days=1, hours=i)) for i in range(n))


def make_usage(world, n):
    """Daily usage of t1, one row per day back."""
    region = Region.objects.get_or_create(slug="us-east-1", defaults={"name": "US East"})[0]
    today = timezone.now().replace(hour=0, minute=0, second=0, microsecond=0)
    base = UsageRollup.objects.count()
    UsageRollup.objects.bulk_create(UsageRollup(
        tenant=world.t1.tenant, team=world.t1.team, period="day", starts_at=today - timedelta(days=base + i),
        resource="gpu", offering=offering, region=region, term="on_demand", quantity=3600, amount="2.49")
        for i, offering in zip(range(n), [vm_offering()] * n, strict=True))


def make_invoices(world, n):
    """Final invoices of t1, each with a line (the list shows lines)."""
    for _ in range(n):
        world_invoice(world.t1.tenant)


def make_budgets(world, n):
    """Budgets of t1's teams, one each (a team has one)."""
    for i in range(n):
        team = Team.objects.create(tenant=world.t1.tenant, slug=f"budget-{Budget.objects.count()}-{i}", name="B")
        Budget.objects.create(tenant=world.t1.tenant, team=team, amount="100.00")


def make_commitments(world, n):
    for _ in range(n):
        world_commitment(world.t1.tenant)


def make_credit_grants(world, n):
    CreditGrant.objects.bulk_create(CreditGrant(tenant=world.t1.tenant, amount="10.00", note=f"grant {i}",
                                                granted_at=timezone.now()) for i in range(n))


def make_webhook_endpoints(world, n):
    WebhookEndpoint.objects.bulk_create(WebhookEndpoint(tenant=world.t1.tenant, url=f"http://127.0.0.1:9/{i}",
                                                        event_types=["*"], secret="whsec_q") for i in range(n))


def make_webhook_deliveries(world, n):
    endpoint = WebhookEndpoint.objects.create(tenant=world.t1.tenant, url="http://127.0.0.1:9/d", event_types=["*"],
                                              secret="whsec_q")
    for i in range(n):
        made = WebhookDelivery.objects.create(tenant=world.t1.tenant, endpoint=endpoint, event_id=uuid.uuid4(),
                                              event_type="webhook.ping", payload={}, next_attempt_at=timezone.now())
        WebhookAttempt.objects.create(delivery=made, status_code=500 + i)


def make_endpoints(world, n):
    for _ in range(n):
        endpoint = world_endpoint(world.t1.tenant)
        reservation = Reservation.objects.create(
            tenant=world.t1.tenant, name=unique("r"), offering=vm_offering(), gpu_model=h100(), units=1, gpus=1,
            regions=["us-east-1"], duration=timedelta(hours=1), state="queued", managed_by=f"endpoint:{endpoint.pk}")
        Replica.objects.create(tenant=world.t1.tenant, endpoint=endpoint, reservation=reservation)


def make_spot_prices(world, n):
    region = Region.objects.get_or_create(slug="us-east-1", defaults={"name": "US East"})[0]
    SpotPrice.objects.bulk_create(SpotPrice(offering=vm_offering(), region=region, per_gpu_hour="1.1000",
                                            utilization="0.5000", at=timezone.now() - timedelta(minutes=5 * i))
                                  for i in range(n))


def make_vpcs(world, n):
    """VPCs of t1, each with an instance in it (the list counts live members)."""
    make_instances(world, n)
    fabric = fleet_node().fabric
    base = VPC.objects.filter(fabric=fabric).count()
    for i, instance in enumerate(Instance.objects.filter(tenant=world.t1.tenant)[:n]):
        vpc = VPC.objects.create(tenant=world.t1.tenant, fabric=fabric, name=f"vpc-{base + i}", state="active",
                                 pkey=0x200 + base + i, cidr=f"10.{40 + base + i}.0.0/24")
        PortMembership.objects.create(vpc=vpc, instance=instance, guid=f"{0x1000 + base + i:016x}", address=None)


def make_trust_anchors(world, n):
    from security import device_pki
    from security.services import trust_anchor_add

    for _ in range(n):
        _, cert = device_pki.make_root(f"Root {secrets.token_hex(4)}")
        trust_anchor_add(actor=None, name="root", certificate_pem=device_pki.cert_to_pem(cert))


def make_revocations(world, n):
    RevokedCertificate.objects.bulk_create([RevokedCertificate(issuer="CN=CA", serial_number=secrets.token_hex(8))
                                            for _ in range(n)])


def make_references(world, n):
    ReferenceMeasurement.objects.bulk_create([ReferenceMeasurement(
        gpu_model="h100-80gb-sxm", vbios_version=secrets.token_hex(4), driver_version="1", measurements={"0": "a" * 96})
        for _ in range(n)])


def make_attestation_reports(world, n):
    AttestationReport.objects.bulk_create([AttestationReport(node_id=uuid.uuid4(), nonce="0" * 64, status="fail",
                                                             reasons=[{"check": "stale"}]) for _ in range(n)])


def make_incidents(world, n):
    Incident.objects.bulk_create([Incident(kind="gpu_reset", tenant_id=world.t1.tenant.pk, summary="A GPU reset",
                                           node_id=uuid.uuid4(), assignee=world.users["platform_admin"])
                                  for _ in range(n)])


ROW_MAKERS: dict[type, Callable[[World, int], None]] = {
    TrustAnchor: make_trust_anchors,
    RevokedCertificate: make_revocations,
    ReferenceMeasurement: make_references,
    AttestationReport: make_attestation_reports,
    Incident: make_incidents,
    ReferenceManifest: lambda world, n: make_manifests(n),
    OcspStatus: lambda world, n: make_ocsp_statuses(n),
    VPC: make_vpcs,
    StorageClass: make_storage_classes,
    Volume: make_volumes,
    Checkpoint: make_checkpoints,
    VolumeSnapshot: make_snapshots,
    Price: make_prices,
    UsageRollup: make_usage,
    Invoice: make_invoices,
    Budget: make_budgets,
    Commitment: make_commitments,
    CreditGrant: make_credit_grants,
    WebhookEndpoint: make_webhook_endpoints,
    Endpoint: make_endpoints,
    WebhookDelivery: make_webhook_deliveries,
    SpotPrice: make_spot_prices,
    Reservation: make_reservations,
    Operation: make_operations,
    Instance: make_instances,
    Tenant: make_tenants,
    Team: make_teams,
    Membership: make_memberships,
    TeamMembership: make_team_memberships,
    Invitation: make_invitations,
    APIToken: make_api_tokens,
    SSHKey: make_ssh_keys,
    Image: make_images,
    Quota: make_quotas,
    AuditEvent: make_audit_events,
    HighPriorityApplication: make_hp_applications,
    Notification: make_notifications,
    Region: make_regions,
    GPUModel: make_gpu_models,
    Offering: make_offerings,
    Fabric: make_fabrics,
    Node: make_nodes,
    GPU: make_gpus,
}


#
# Trimmers: bring the world's rows of a model, as the caller sees them, to at most SMALL.
#


def _persona_prefix(world: World, persona: str) -> str:
    return world.tokens[persona].split("_")[1]


def trim_memberships(world):
    keep = [world.users["t1_owner"], world.users["t1_member"]]
    Membership.objects.filter(tenant=world.t1.tenant).exclude(user__in=keep).delete()


def trim_api_tokens(world):
    APIToken.objects.filter(tenant=world.t1.tenant).exclude(prefix=_persona_prefix(world, "t1_owner")).delete()


def trim_audit_events(world):
    AuditEvent.objects.filter(tenant_id=world.t1.tenant.pk).delete()


def trim_gpu_models(world):
    Reservation.objects.all().delete()
    Offering.objects.all().delete()
    GPUModel.objects.all().delete()


def trim_reservations(world):
    Reservation.objects.filter(tenant=world.t1.tenant).delete()


TRIMMERS: dict[type, Callable[[World], None]] = {
    Reservation: trim_reservations,
    Operation: trim_reservations,
    Membership: trim_memberships,
    APIToken: trim_api_tokens,
    AuditEvent: trim_audit_events,
    GPUModel: trim_gpu_models,
}

# A tenant principal acts in one tenant and sees only that one; staff list every tenant.
CALLER_OVERRIDES = {"tenants": "platform_admin", "sla": "platform_admin"}


def caller_for(prefix: str, viewset) -> str:
    if prefix in CALLER_OVERRIDES:
        return CALLER_OVERRIDES[prefix]
    return "platform_admin" if issubclass(viewset, PlatformViewSet) else "t1_owner"


LIST_ROUTES = [(prefix, viewset) for prefix, viewset, _ in router.registry if hasattr(viewset, "list")]


def test_every_list_route_has_a_row_maker():
    """The walk finds the router's list routes, and each lists a model this file knows how to make."""
    assert {"teams", "api-tokens", "offerings", "nodes", "gpus", "audit-events"} <= {p for p, _ in LIST_ROUTES}
    missing = [f"/api/v1/{p}/ ({v.queryset.model.__name__})"
               for p, v in LIST_ROUTES if v.queryset.model not in ROW_MAKERS]
    assert not missing, f"List routes without a row-maker in ROW_MAKERS: {', '.join(missing)}"


def _list(client, url: str, expected: int) -> int:
    # The rows just made may be memberships or tokens, which make the token's principal be read
    # again (tenants.token_cache): the request before the measured one does that.
    client.get(url)
    with CaptureQueriesContext(connection) as queries:
        response = client.get(url)
    assert response.status_code == 200, response.content[:600]
    assert response.json()["count"] == expected, f"{url} shows {response.json()['count']} rows, expected {expected}"
    return len(queries)


@pytest.mark.parametrize(("prefix", "viewset"), LIST_ROUTES, ids=[prefix for prefix, _ in LIST_ROUTES])
def test_list_query_count_does_not_grow_with_rows(world, prefix, viewset):
    """Listing 20 rows takes exactly as many queries as listing 2."""
    model = viewset.queryset.model
    make = ROW_MAKERS.get(model)
    if make is None:
        pytest.fail(f"/api/v1/{prefix}/ lists {model.__name__}, which has no row-maker in ROW_MAKERS of "
                    f"tests/test_query_counts.py; add one so this route's query count is guarded.")
    url = f"/api/v1/{prefix}/"
    client = world.client(caller_for(prefix, viewset))
    TRIMMERS.get(model, lambda w: None)(world)
    visible = client.get(url).json()["count"]
    assert visible <= SMALL, f"{url} already shows {visible} rows; trim them to at most {SMALL}"

    make(world, SMALL - visible)
    client.get(url)  # warm-up: the token's last_used_at write happens here, not in a measured request
    small = _list(client, url, SMALL)
    make(world, LARGE - SMALL)
    large = _list(client, url, LARGE)

    assert large == small, f"{url}: {small} queries for {SMALL} rows but {large} for {LARGE} (N+1)"


#
# Detail actions whose answer grows with data (telemetry series): the same queries for a little
# data as for a lot. Each maker gives the caller's object ``n`` GPUs with samples and rollups.
#


def _telemetry_rows(gpus, at) -> None:
    from cloud import telemetry

    by_node: dict = {}
    for gpu in gpus:
        by_node.setdefault(gpu.node, []).append({"uuid": gpu.uuid, "utilization_pct": 40, "xids": [13]})
    for step in range(3):
        for node, samples in by_node.items():
            telemetry.ingest(node=node, samples=samples, ports=[], now=at + timedelta(seconds=10 * step))
    telemetry.rollup(now=at + timedelta(minutes=2))


def telemetry_of_reservation(world, n):
    """t1's reservation holding n GPUs of the fleet, with their samples and rollups."""
    from provisioning.models import Allocation

    reservation = world.t1.objects[Reservation]
    fleet_node()
    Allocation.objects.filter(reservation=reservation).delete()
    at = timezone.now() - timedelta(minutes=5)
    gpus = list(GPU.objects.order_by("node__hostname", "index")[:n])
    Allocation.objects.bulk_create([Allocation(reservation=reservation, gpu=g, node_id=g.node_id, mem_lo=0,
                                               mem_hi=g.memory_mib, starts_at=at - timedelta(hours=1),
                                               ends_at=at + timedelta(hours=1)) for g in gpus])
    _telemetry_rows(gpus, at)
    return f"/api/v1/reservations/{reservation.pk}/telemetry/?period=raw", "t1_owner"


def telemetry_of_gpu(world, n):
    """One GPU with n heartbeats' worth of samples."""
    fleet_node()
    gpu = GPU.objects.order_by("node__hostname", "index").first()
    for _ in range(n):
        _telemetry_rows([gpu], timezone.now() - timedelta(minutes=5))
    return f"/api/v1/gpus/{gpu.pk}/telemetry/?period=raw", "platform_admin"


def usage_of_reservation(world, n):
    """
    t1's reservation, active on n GPUs with samples and rollups: its usage evidence
    (provisioning.lifecycle.no_shows).
    """
    url, persona = telemetry_of_reservation(world, n)
    reservation = world.t1.objects[Reservation]
    Reservation.objects.filter(pk=reservation.pk).update(
        state="active", starts_at=timezone.now() - timedelta(hours=1), ends_at=timezone.now() + timedelta(hours=1))
    return f"/api/v1/reservations/{reservation.pk}/usage/", persona


DETAIL_ACTIONS = {"reservations-telemetry": telemetry_of_reservation, "gpus-telemetry": telemetry_of_gpu,
                  "reservations-usage": usage_of_reservation}


@pytest.mark.parametrize("name", list(DETAIL_ACTIONS))
def test_detail_action_query_count_does_not_grow_with_data(world, name):
    from cloud.models import GPUSample, GPUSampleRollup

    counts = []
    for n in (1, 8):
        GPUSample.objects.all().delete()
        GPUSampleRollup.objects.all().delete()
        url, persona = DETAIL_ACTIONS[name](world, n)
        client = world.client(persona)
        client.get(url)  # warm-up: the token's last_used_at write happens here
        with CaptureQueriesContext(connection) as queries:
            response = client.get(url)
        assert response.status_code == 200, response.content[:300]
        counts.append(len(queries))
    assert counts[0] == counts[1], f"{name}: {counts[0]} queries for a little data, {counts[1]} for a lot"
