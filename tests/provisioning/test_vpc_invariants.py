"""
IB-VPC invariants: P_Keys drawn under concurrency, isolation on the fabric under random sequences
of provisioning, release, drift and reconciliation (hypothesis), and the reconciler's repairs.

The fabric is the simulated one: its partitions live in the SimulatedDevice row
"fabric:<region>/<fabric>", which the drift tests edit directly (as a rogue operator or a buggy
subnet manager would) -- the driver itself refuses a full member of the default partition.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from datetime import timedelta

import pytest
from django.db import connections, transaction
from django.utils import timezone
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from cloud.models import Fabric, HCAPort, Node
from core.errors import Conflict
from provisioning.choices import VPCState
from provisioning.drivers import DriverError, fabric_driver_for
from provisioning.drivers.fabric import DEFAULT_PKEY, FULL, LIMITED
from provisioning.drivers.simulated import SimulatedFabric
from provisioning.models import (
    VPC,
    FabricReconciliation,
    Instance,
    PortMembership,
    Reservation,
    SimulatedDevice,
    VirtualFunction,
)
from provisioning.networks import ports as network
from provisioning.networks import vpcs
from provisioning.networks.ports import fabric_reconcile, isolation_violations, still_members
from provisioning.networks.vpcs import vpc_create, vpc_delete, vpc_sync
from security.models import Incident
from tenants.choices import QuotaResource, TenantRole
from tenants.models import Membership, Quota, Tenant
from tenants.scoping import Principal
from tests.provisioning.factories import make_reservation, offering
from tests.provisioning.pipeline import SSH_KEY
from tests.world import make_user, small_fleet, unique, vm_offering

URL = "/api/v1/reservations/"
LIVE_INSTANCE_STATES = ("active",)


#
# Helpers
#


def the_fabric() -> Fabric:
    return Fabric.objects.select_related("region").get()


def device_key(fabric: Fabric) -> str:
    return f"fabric:{fabric.region.slug}/{fabric.slug}"


def edit_fabric(fabric: Fabric, change) -> None:
    """Change the simulated fabric's stored partitions behind the driver's back (drift)."""
    row, _ = SimulatedDevice.objects.get_or_create(key=device_key(fabric))
    state = dict(row.state)
    partitions = state.setdefault("partitions", {})
    change(partitions)
    SimulatedDevice.objects.filter(pk=row.pk).update(state=state)


def inject_member(fabric: Fabric, pkey: int, guid: str, membership: str = FULL) -> None:
    def change(partitions):
        if pkey == DEFAULT_PKEY:
            partitions.setdefault(str(DEFAULT_PKEY), {"name": "Default", "mtu": 4096, "rate_gbps": None,
                                                      "service_level": 0, "ipoib": True, "members": {}})
        partitions[str(pkey)]["members"][guid] = membership
    edit_fabric(fabric, change)


def inject_partition(fabric: Fabric, pkey: int, members: dict[str, str]) -> None:
    def change(partitions):
        partitions[str(pkey)] = {"name": "rogue", "mtu": 4096, "rate_gbps": None, "service_level": 0,
                                 "ipoib": True, "members": dict(members)}
    edit_fabric(fabric, change)


def tenant_ports(fabric: Fabric) -> set[str]:
    ports = set(HCAPort.objects.filter(node__fabric=fabric).values_list("guid", flat=True))
    return ports | set(VirtualFunction.objects.filter(port__node__fabric=fabric).values_list("guid", flat=True))


def conflict_code(exc: Conflict) -> str:
    codes = exc.get_codes()
    return codes if isinstance(codes, str) else str(codes)


def member_principal(tenant: Tenant) -> Principal:
    user = make_user(f"{unique('vpc-user')}@example.com")
    Membership.objects.create(tenant=tenant, user=user, role=TenantRole.MEMBER)
    return Principal(user=user, tenant=tenant, role=TenantRole.MEMBER)


def generous_quotas(tenant: Tenant) -> None:
    Quota.objects.update_or_create(tenant=tenant, team=None, resource=QuotaResource.VPCS, gpu_model=None,
                                   defaults={"limit": 1000})
    Quota.objects.filter(tenant=tenant, resource=QuotaResource.GPUS).update(limit=1000)


def create_reservation(world, persona: str, *, bare_metal: bool, vpc: VPC | None = None):
    """A reservation through the API; its id when it was scheduled now, else None (no room, or refused)."""
    body = {"name": unique("job"), "regions": ["us-east-1"], "duration_hours": 2, "ssh_public_key": SSH_KEY}
    if bare_metal:
        body.update(offering=offering("bare_metal", 8).slug, nodes=1)
    else:
        body.update(offering=vm_offering(1).slug, gpus=1)
    if vpc is not None:
        body["vpc"] = str(vpc.pk)
    response = world.client(persona).post(URL, body, format="json")
    assert response.status_code < 500, response.content
    if response.status_code != 201:
        return None
    created = response.json()
    if created["state"] != "scheduled":
        world.client(persona).post(f"{URL}{created['id']}/cancel/")
        return None
    return created["id"]


def release_reservation(world, persona: str, pk) -> None:
    response = world.client(persona).post(f"{URL}{pk}/release/")
    assert response.status_code < 500, response.content


#
# What must always hold
#


def database_invariants(fabric: Fabric) -> None:
    """No GUID is a live member of two VPCs; a live membership is in a VPC not deleted, of its instance's tenant."""
    live = PortMembership.objects.filter(left_at__isnull=True, vpc__fabric=fabric)
    per_guid = defaultdict(set)
    for guid, vpc_id, vpc_tenant, instance_tenant, vpc_state in live.values_list(
            "guid", "vpc_id", "vpc__tenant_id", "instance__tenant_id", "vpc__state"):
        per_guid[guid].add(vpc_id)
        assert vpc_tenant == instance_tenant, f"{guid} joined a VPC of another tenant"
        assert vpc_state != VPCState.DELETED, f"{guid} is a live member of a deleted VPC"
    assert {g: v for g, v in per_guid.items() if len(v) > 1} == {}
    keys = list(VPC.objects.filter(fabric=fabric).exclude(state=VPCState.DELETED).values_list("pkey", flat=True))
    assert len(keys) == len(set(keys)), "two live VPCs share a P_Key"
    assert all(fabric.pkey_min <= k <= fabric.pkey_max for k in keys)


def members_are_joined(fabric: Fabric, actual) -> None:
    """Every live membership is a full member of its VPC's partition on the fabric; active instances have them."""
    for guid, pkey in PortMembership.objects.filter(left_at__isnull=True, vpc__fabric=fabric).values_list(
            "guid", "vpc__pkey"):
        assert pkey in actual, f"partition {pkey:#06x} of a live VPC is missing on the fabric"
        assert actual[pkey].members.get(guid) == FULL, f"{guid} is not a full member of {pkey:#06x}"
    for instance in Instance.objects.filter(state__in=LIVE_INSTANCE_STATES, node__fabric=fabric):
        ports = set(network.instance_ports(instance, assign=False))
        joined = set(PortMembership.objects.filter(instance=instance, left_at__isnull=True).values_list(
            "guid", flat=True))
        assert ports and ports == joined, f"{instance.name}'s ports {ports} are not its live memberships {joined}"


def fabric_isolated(fabric: Fabric, actual) -> None:
    """From the fabric's read-back: no port in two owners' partitions, no tenant port full in 0x7FFF."""
    assert isolation_violations(fabric) == []
    owner = dict(VPC.objects.filter(fabric=fabric).exclude(state=VPCState.DELETED).values_list("pkey", "tenant_id"))
    owners = defaultdict(set)
    for pkey, partition in actual.items():
        if pkey != DEFAULT_PKEY:
            for guid in partition.members:
                owners[guid].add(owner.get(pkey, f"nobody's {pkey:#06x}"))
    assert {g: o for g, o in owners.items() if len(o) > 1} == {}
    ours = tenant_ports(fabric)
    default = actual.get(DEFAULT_PKEY)
    full_default = sorted(g for g, m in (default.members.items() if default else ()) if m == FULL and g in ours)
    assert full_default == []


def released_ports_are_out(fabric: Fabric, actual) -> None:
    """A released instance's ports that nobody holds now are in no tenant partition (nor full in 0x7FFF)."""
    live = set(PortMembership.objects.filter(left_at__isnull=True).values_list("guid", flat=True))
    for instance in Instance.objects.filter(state="released", node__fabric=fabric):
        guids = set(PortMembership.objects.filter(instance=instance).values_list("guid", flat=True)) - live
        assert still_members(actual, guids) == [], f"released {instance.name} still reaches someone"


def partitions_hold_only_their_members(fabric: Fabric, actual) -> None:
    """After a reconcile: every tenant partition holds exactly its live members (and those leaving now)."""
    grace = timezone.now() - network.LEAVING_GRACE
    for vpc in VPC.objects.filter(fabric=fabric, state=VPCState.ACTIVE):
        rows = PortMembership.objects.filter(vpc=vpc)
        live = set(rows.filter(left_at__isnull=True).values_list("guid", flat=True))
        leaving = set(rows.filter(left_at__gt=grace).values_list("guid", flat=True))
        members = set(actual[vpc.pkey].members)
        assert live <= members <= live | leaving, (vpc.name, members, live, leaving)
    owned = set(VPC.objects.filter(fabric=fabric).exclude(state=VPCState.DELETED).values_list("pkey", flat=True))
    stray = [p for p in actual if p != DEFAULT_PKEY and p not in owned and fabric.pkey_min <= p <= fabric.pkey_max]
    assert stray == []


#
# 1. P_Keys under concurrency
#


def race_creates(fabric: Fabric, principals: list[Principal], count: int) -> tuple[list[VPC], list[str], list[str]]:
    """``count`` vpc_create calls at once (30 connections at a time): the VPCs made, the Conflict codes, the rest."""
    made, refused, errors = [], [], []
    gate = threading.Semaphore(30)  # PostgreSQL allows 100 connections, shared with other test processes
    go = threading.Event()  # every thread is started before the first one creates
    lock = threading.Lock()

    def create(i: int):
        with gate:
            try:
                go.wait(timeout=30)
                vpc = vpc_create(actor=principals[i % len(principals)], fabric=fabric, name=unique("race"))
                with lock:
                    made.append(vpc)
            except Conflict as exc:
                with lock:
                    refused.append(conflict_code(exc))
            except Exception as exc:  # noqa: BLE001 -- anything else fails the test
                with lock:
                    errors.append(repr(exc))
            finally:
                connections.close_all()

    threads = [threading.Thread(target=create, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    go.set()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a create hung"
    return made, refused, errors


@pytest.fixture
def racers(world, monkeypatch):
    """A fleet, and members of five tenants (the world's two and three more) with room for many VPCs."""
    monkeypatch.setattr(vpcs, "_sync_after_commit", lambda vpc: None)  # no broker: the partitions are not made
    small_fleet(4)
    principals = [Principal(user=world.users["t1_member"], tenant=world.t1.tenant, role=TenantRole.MEMBER),
                  Principal(user=world.users["t2_member"], tenant=world.t2.tenant, role=TenantRole.MEMBER)]
    for _ in range(3):
        principals.append(member_principal(Tenant.objects.create(name=unique("Racer"), slug=unique("racer"))))
    for principal in principals:
        generous_quotas(principal.tenant)
    return principals


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_100_racing_creates_draw_100_distinct_pkeys_from_the_pool(racers):
    fabric = the_fabric()
    Fabric.objects.filter(pk=fabric.pk).update(pkey_min=0x0200, pkey_max=0x0400)
    fabric.refresh_from_db()
    made, refused, errors = race_creates(fabric, racers, 100)
    assert errors == []
    assert refused == []
    keys = [vpc.pkey for vpc in made]
    assert len(keys) == 100 and len(set(keys)) == 100
    assert all(0x0200 <= k <= 0x0400 for k in keys)
    assert sorted(keys) == list(range(0x0200, 0x0200 + 100))  # the lowest free ones, none skipped
    stored = list(VPC.objects.filter(fabric=fabric).values_list("pkey", flat=True))
    assert sorted(stored) == sorted(keys)
    # Each tenant's subnets do not overlap either (drawn under the tenant's lock).
    for principal in racers:
        cidrs = list(VPC.objects.filter(tenant=principal.tenant).values_list("cidr", flat=True))
        assert len(cidrs) == len(set(cidrs))


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_100_racing_creates_on_a_pool_of_40_keys_make_exactly_40(racers):
    fabric = the_fabric()
    Fabric.objects.filter(pk=fabric.pk).update(pkey_min=0x1000, pkey_max=0x1000 + 39)
    fabric.refresh_from_db()
    made, refused, errors = race_creates(fabric, racers, 100)
    assert errors == []
    assert len(made) == 40
    assert refused == ["pkey_pool_exhausted"] * 60
    keys = sorted(vpc.pkey for vpc in made)
    assert keys == list(range(0x1000, 0x1000 + 40))
    # Nothing half-made: the refused left no row, no audit of a create.
    assert VPC.objects.filter(fabric=fabric).count() == 40
    from security.models import AuditEvent

    assert AuditEvent.objects.filter(action="vpc.create").count() == 40


@pytest.mark.django_db(transaction=True)
def test_a_deleted_vpcs_pkey_is_drawn_again_only_once_the_fabric_confirms_the_partition_gone(racers, settings):
    fabric = the_fabric()
    Fabric.objects.filter(pk=fabric.pk).update(pkey_min=0x0300, pkey_max=0x0302)
    fabric.refresh_from_db()
    actor = racers[0]
    first, second, third = (vpc_create(actor=actor, fabric=fabric, name=unique("v")) for _ in range(3))
    assert [first.pkey, second.pkey, third.pkey] == [0x0300, 0x0301, 0x0302]
    for vpc in (first, second, third):
        assert vpc_sync(vpc.pk) == VPCState.ACTIVE
    driver = fabric_driver_for(fabric)
    assert {0x0300, 0x0301, 0x0302} <= set(driver.read())

    gone = vpc_delete(actor=actor, vpc=second)
    assert gone.state == VPCState.DELETING
    # Deleting: the partition may still be on the fabric, so its key is not free.
    with pytest.raises(Conflict) as refused:
        vpc_create(actor=racers[1], fabric=fabric, name=unique("v"))
    assert conflict_code(refused.value) == "pkey_pool_exhausted"
    with pytest.raises(Conflict) as asked:
        vpc_create(actor=racers[1], fabric=fabric, name=unique("v"), pkey=0x0301)
    assert conflict_code(asked.value) == "pkey_unavailable"

    # The fabric will not delete it for now: still deleting, still taken.
    settings.MERIDIAN_SIMULATION = {**settings.MERIDIAN_SIMULATION, "failure_rate": {"delete_partition": 1.0}}
    with pytest.raises(DriverError):
        vpc_sync(second.pk)
    assert VPC.objects.get(pk=second.pk).state == VPCState.DELETING
    assert 0x0301 in driver.read()
    with pytest.raises(Conflict):
        vpc_create(actor=racers[1], fabric=fabric, name=unique("v"))

    settings.MERIDIAN_SIMULATION = {**settings.MERIDIAN_SIMULATION, "failure_rate": {}}
    assert vpc_sync(second.pk) == VPCState.DELETED
    assert 0x0301 not in driver.read()
    again = vpc_create(actor=racers[1], fabric=fabric, name=unique("v"))
    assert again.pkey == 0x0301 and again.tenant_id == racers[1].tenant.pk
    assert vpc_sync(again.pk) == VPCState.ACTIVE
    # The new partition starts empty: nothing of the deleted VPC carries over.
    assert driver.read()[0x0301].members == {}


#
# 2. Random sequences of operations (hypothesis)
#


class Isolation(RuleBasedStateMachine):
    """
    Two tenants on a four-node fleet (three bare-metal servers and a shared host) create VPCs,
    provision and release bare metal and VMs through the API, delete VPCs; drift is injected into
    the simulated fabric and the reconciler repairs it. Each example starts from the same
    database (a savepoint rolled back at its end).
    """

    world = steps = fabric = None  # set by the test

    def __init__(self):
        super().__init__()
        self.savepoint = transaction.savepoint()
        self.steps.queue.clear()
        self.dirty = False  # drift injected and not reconciled yet
        self.reservations: list[tuple[str, str]] = []  # (persona, reservation id) provisioned, not released

    def teardown(self):
        transaction.savepoint_rollback(self.savepoint)
        self.steps.queue.clear()

    PERSONAS = ("t1_member", "t2_member")

    def tenant_of(self, persona):
        return self.world.side(persona[:2]).tenant

    def principal(self, persona):
        return Principal(user=self.world.users[persona], tenant=self.tenant_of(persona), role=TenantRole.MEMBER)

    def read(self):
        return fabric_driver_for(self.fabric).read()

    def vpcs_of(self, persona, *, default=True):
        qs = VPC.objects.filter(tenant=self.tenant_of(persona), fabric=self.fabric).exclude(
            state=VPCState.DELETED).order_by("created_at", "pkey")
        return list(qs if default else qs.filter(is_default=False))

    # Operations

    @initialize(who=st.sampled_from(PERSONAS), bare_metal=st.booleans())
    def someone_is_running(self, who, bare_metal):
        """Each example starts with one tenant's instance up, so there is someone to be isolated from."""
        self.provision(who, bare_metal, -1)

    @rule(who=st.sampled_from(PERSONAS), sync=st.booleans())
    def create_vpc(self, who, sync):
        try:
            vpc = vpc_create(actor=self.principal(who), fabric=self.fabric, name=unique("net"))
        except Conflict:
            return
        if sync:  # the task after the commit (else the first join or the reconciler makes the partition)
            assert vpc_sync(vpc.pk) == VPCState.ACTIVE

    @rule(who=st.sampled_from(PERSONAS), bare_metal=st.booleans(), pick=st.integers(-1, 5))
    def provision(self, who, bare_metal, pick):
        mine = self.vpcs_of(who, default=False)
        vpc = mine[pick % len(mine)] if pick >= 0 and mine else None
        pk = create_reservation(self.world, who, bare_metal=bare_metal, vpc=vpc)
        self.steps.run()
        if pk is not None:
            reservation = Reservation.objects.get(pk=pk)
            assert reservation.state == "active", (reservation.state, reservation.state_reason)
            self.reservations.append((who, pk))

    @precondition(lambda self: self.reservations)
    @rule(pick=st.integers(0, 20))
    def release(self, pick):
        who, pk = self.reservations.pop(pick % len(self.reservations))
        release_reservation(self.world, who, pk)
        self.steps.run()
        assert Reservation.objects.get(pk=pk).state == "released"

    @rule(who=st.sampled_from(PERSONAS), pick=st.integers(0, 5))
    def delete_vpc(self, who, pick):
        mine = self.vpcs_of(who)
        if not mine:
            return
        vpc = mine[pick % len(mine)]
        try:
            vpc_delete(actor=self.principal(who), vpc=vpc)
        except Conflict as exc:
            assert conflict_code(exc) == "vpc_in_use"
            assert PortMembership.objects.filter(vpc=vpc, left_at__isnull=True).exists() or \
                Reservation.objects.filter(vpc=vpc).exclude(state__in=("released", "cancelled", "failed",
                                                                         "expired", "rejected")).exists()
            return
        assert vpc_sync(vpc.pk) == VPCState.DELETED  # the task after the commit
        assert vpc.pkey not in self.read()

    @rule(kind=st.sampled_from(["foreign", "idle", "full_default", "rogue"]), a=st.integers(0, 10_000),
          b=st.integers(0, 10_000))
    def inject_drift(self, kind, a, b):
        """
        Drift behind the driver's back: a port of another tenant's instance ("foreign") or of an idle
        node ("idle") made a full member of a tenant partition; a tenant port made a full member of
        0x7FFF; a partition no VPC owns, inside the pool, with someone's port in it ("rogue").
        """
        ports = sorted(tenant_ports(self.fabric))
        if kind == "full_default":
            guid = ports[a % len(ports)]
            inject_member(self.fabric, DEFAULT_PKEY, guid, FULL)
            self.dirty = True
            assert f"tenant port {guid} is a full member of the default partition" in isolation_violations(
                self.fabric)
            return
        if kind == "rogue":
            pkey = 0x6000 + b % 64
            if not VPC.objects.filter(fabric=self.fabric, pkey=pkey).exclude(state=VPCState.DELETED).exists():
                inject_partition(self.fabric, pkey, {ports[a % len(ports)]: FULL})
                self.dirty = True
            return
        actual = self.read()
        active = [vpc for vpc in VPC.objects.filter(fabric=self.fabric, state=VPCState.ACTIVE).order_by("pkey")
                  if vpc.pkey in actual]
        if not active:
            return
        vpc = active[b % len(active)]
        # A port that left this very partition moments ago is in the leaving grace: not drift yet.
        recent = set(PortMembership.objects.filter(vpc=vpc, left_at__isnull=False).values_list("guid", flat=True))
        if kind == "foreign":  # an instance of another tenant, then one of its ports (a VM has one)
            owners = PortMembership.objects.filter(left_at__isnull=True).exclude(vpc__tenant=vpc.tenant)
            by_owner = defaultdict(list)
            for name, guid in owners.order_by("instance__name", "guid").values_list("instance__name", "guid"):
                by_owner[name].append(guid)
        else:  # a node nobody is using, then one of its ports
            by_owner = defaultdict(list)
            for hostname, guid in HCAPort.objects.filter(node__fabric=self.fabric).exclude(
                    node__instances__state__in=LIVE_INSTANCE_STATES).order_by("node__hostname", "index").values_list(
                    "node__hostname", "guid"):
                by_owner[hostname].append(guid)
        choices = [[g for g in guids if g not in recent] for _, guids in sorted(by_owner.items())]
        choices = [guids for guids in choices if guids]
        if not choices:
            return
        ports_of = choices[a % len(choices)]
        guid = ports_of[(a // len(choices)) % len(ports_of)]
        inject_member(self.fabric, vpc.pkey, guid, FULL)
        self.dirty = True
        if kind == "foreign":
            assert isolation_violations(self.fabric) != []

    @rule()
    def reconcile(self):
        run = fabric_reconcile(self.fabric)
        assert run.ok, run.error
        self.dirty = False
        actual = self.read()
        fabric_isolated(self.fabric, actual)
        partitions_hold_only_their_members(self.fabric, actual)
        # A second pass finds nothing left to repair.
        again = fabric_reconcile(self.fabric)
        assert again.ok and again.drift == [], again.drift

    # What always holds

    @invariant()
    def isolated(self):
        database_invariants(self.fabric)
        actual = self.read()
        members_are_joined(self.fabric, actual)
        if not self.dirty:
            fabric_isolated(self.fabric, actual)
            released_ports_are_out(self.fabric, actual)


@pytest.mark.slow
def test_isolation_holds_under_random_operations_drift_and_reconciliation(world, steps):
    Reservation.objects.all().delete()  # the world's own queued work would compete
    small_fleet(4)
    for side in (world.t1, world.t2):
        generous_quotas(side.tenant)
    Isolation.world, Isolation.steps, Isolation.fabric = world, steps, the_fabric()
    try:
        run_state_machine_as_test(Isolation, settings=settings(
            max_examples=12, stateful_step_count=22, deadline=None, derandomize=True, database=None,
            phases=[Phase.explicit, Phase.generate],  # no shrinking: a failure prints its whole run at once
            suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                   HealthCheck.filter_too_much]))
    finally:
        Isolation.world = Isolation.steps = Isolation.fabric = None


#
# 3. The reconciler's repairs
#


@pytest.fixture
def fleet(world):
    Reservation.objects.all().delete()
    return small_fleet(4)


def provisioned(world, steps, persona="t1_member", *, bare_metal=True, vpc=None) -> Instance:
    pk = create_reservation(world, persona, bare_metal=bare_metal, vpc=vpc)
    assert pk is not None
    steps.run()
    assert Reservation.objects.get(pk=pk).state == "active"
    return Instance.objects.get(reservation_id=pk)


def live_vpc(instance: Instance) -> VPC:
    return PortMembership.objects.filter(instance=instance, left_at__isnull=True).select_related("vpc").first().vpc


def idle_port(fabric: Fabric) -> str:
    node = Node.objects.filter(fabric=fabric, pool="bare_metal", instances__isnull=True).order_by("hostname").first()
    return node.ib_ports.order_by("index").first().guid


def test_an_extra_port_in_a_tenant_partition_is_removed_with_an_incident(world, fleet, steps):
    instance = provisioned(world, steps)
    vpc, fabric = live_vpc(instance), instance.node.fabric
    stranger = idle_port(fabric)
    inject_member(fabric, vpc.pkey, stranger, FULL)
    assert SimulatedFabric(name=str(fabric)).reachable(stranger, instance.node.ib_ports.first().guid)

    run = fabric_reconcile(fabric)
    assert run.ok and run.error == ""
    assert stranger not in fabric_driver_for(fabric).read()[vpc.pkey].members
    assert [(d["kind"], d["pkey"], d["vpc"], d["guids"]) for d in run.drift] == [
        ("extra_member", vpc.pkey, str(vpc.pk), [stranger])]
    incident = Incident.objects.get(kind="fabric_drift")
    assert incident.tenant_id == vpc.tenant_id == world.t1.tenant.pk
    assert incident.fabric_id == fabric.pk and incident.evidence["guids"] == [stranger]
    # The instance's own ports stayed.
    members = fabric_driver_for(fabric).read()[vpc.pkey].members
    assert all(members.get(g) == FULL for g in network.instance_ports(instance, assign=False))


def test_another_tenants_port_in_a_partition_is_removed_and_isolation_restored(world, fleet, steps):
    mine = provisioned(world, steps, "t1_member")
    theirs = provisioned(world, steps, "t2_member", bare_metal=False)
    fabric, vpc = mine.node.fabric, live_vpc(mine)
    (vf,) = network.instance_ports(theirs, assign=False)
    inject_member(fabric, vpc.pkey, vf, FULL)
    assert isolation_violations(fabric) == [f"port {vf} is in partitions of 2 owners"]
    run = fabric_reconcile(fabric)
    assert run.ok and [d["kind"] for d in run.drift] == ["extra_member"]
    assert isolation_violations(fabric) == []
    actual = fabric_driver_for(fabric).read()
    assert vf not in actual[vpc.pkey].members and actual[live_vpc(theirs).pkey].members[vf] == FULL
    assert Incident.objects.get(kind="fabric_drift").tenant_id == world.t1.tenant.pk


def test_a_missing_member_is_added_back_without_an_incident(world, fleet, steps):
    instance = provisioned(world, steps)
    vpc, fabric = live_vpc(instance), instance.node.fabric
    lost = network.instance_ports(instance, assign=False)[3]
    edit_fabric(fabric, lambda partitions: partitions[str(vpc.pkey)]["members"].pop(lost))
    assert lost not in fabric_driver_for(fabric).read()[vpc.pkey].members

    run = fabric_reconcile(fabric)
    assert run.ok
    assert [(d["kind"], d["guids"]) for d in run.drift] == [("missing_member", [lost])]
    assert fabric_driver_for(fabric).read()[vpc.pkey].members[lost] == FULL
    assert not Incident.objects.filter(kind="fabric_drift").exists()


def test_a_missing_partition_is_programmed_again_with_its_members(world, fleet, steps):
    instance = provisioned(world, steps)
    vpc, fabric = live_vpc(instance), instance.node.fabric
    edit_fabric(fabric, lambda partitions: partitions.pop(str(vpc.pkey)))
    run = fabric_reconcile(fabric)
    assert run.ok
    assert [d["kind"] for d in run.drift] == ["missing_partition", "missing_member"]
    members = fabric_driver_for(fabric).read()[vpc.pkey].members
    assert members == {g: FULL for g in network.instance_ports(instance, assign=False)}


def test_a_partition_no_vpc_owns_is_deleted_with_an_incident(world, fleet, steps):
    instance = provisioned(world, steps)
    fabric = instance.node.fabric
    guid = network.instance_ports(instance, assign=False)[0]
    inject_partition(fabric, 0x5555, {guid: FULL, idle_port(fabric): FULL})
    assert isolation_violations(fabric) != []
    run = fabric_reconcile(fabric)
    assert run.ok
    assert [(d["kind"], d["pkey"], d["action"]) for d in run.drift] == [("unknown_partition", 0x5555, "deleted")]
    assert 0x5555 not in fabric_driver_for(fabric).read()
    incident = Incident.objects.get(kind="fabric_drift")
    assert incident.tenant_id is None and incident.evidence["pkey"] == 0x5555
    assert isolation_violations(fabric) == []


def test_a_partition_outside_the_pool_is_left_alone(world, fleet, steps):
    fabric = the_fabric()
    Fabric.objects.filter(pk=fabric.pk).update(pkey_min=0x0100, pkey_max=0x01ff)
    fabric.refresh_from_db()
    inject_partition(fabric, 0x0050, {})  # the operator's own, outside the tenants' pool
    run = fabric_reconcile(fabric)
    assert run.ok and run.drift == []
    assert 0x0050 in fabric_driver_for(fabric).read()


def test_a_tenant_port_full_in_the_default_partition_is_made_limited_with_an_incident(world, fleet, steps):
    instance = provisioned(world, steps)
    fabric = instance.node.fabric
    guid = network.instance_ports(instance, assign=False)[0]
    assert fabric_driver_for(fabric).read()[DEFAULT_PKEY].members[guid] == LIMITED
    with pytest.raises(DriverError):  # the driver refuses it; only drift gets there
        fabric_driver_for(fabric).set_members(DEFAULT_PKEY, {guid: FULL})
    inject_member(fabric, DEFAULT_PKEY, guid, FULL)
    inject_member(fabric, DEFAULT_PKEY, "00000000deadbeef", FULL)  # not a tenant port: the fabric's own
    assert isolation_violations(fabric) == [f"tenant port {guid} is a full member of the default partition"]

    run = fabric_reconcile(fabric)
    assert run.ok
    assert [(d["kind"], d["guids"]) for d in run.drift] == [("full_default_member", [guid])]
    default = fabric_driver_for(fabric).read()[DEFAULT_PKEY].members
    assert default[guid] == LIMITED and default["00000000deadbeef"] == FULL
    incident = Incident.objects.get(kind="fabric_drift")
    assert incident.evidence["guids"] == [guid] and incident.tenant_id is None
    assert isolation_violations(fabric) == []


def test_a_port_that_left_moments_ago_is_not_drift_but_is_after_the_grace(world, fleet, steps):
    instance = provisioned(world, steps)
    vpc, fabric = live_vpc(instance), instance.node.fabric
    guids = network.instance_ports(instance, assign=False)
    # A release between closing its rows and the fabric call: the ports are still in the partition.
    PortMembership.objects.filter(instance=instance).update(left_at=timezone.now() - timedelta(seconds=30))
    run = fabric_reconcile(fabric)
    assert run.ok and run.drift == []
    assert not Incident.objects.exists()
    assert set(guids) <= set(fabric_driver_for(fabric).read()[vpc.pkey].members)

    PortMembership.objects.filter(instance=instance).update(
        left_at=timezone.now() - network.LEAVING_GRACE - timedelta(seconds=1))
    run = fabric_reconcile(fabric)
    assert run.ok and [(d["kind"], d["guids"]) for d in run.drift] == [("extra_member", sorted(guids))]
    assert not set(guids) & set(fabric_driver_for(fabric).read()[vpc.pkey].members)


def test_a_failing_fabric_makes_the_run_not_ok_and_records_the_error(world, fleet, steps, monkeypatch):
    instance = provisioned(world, steps)
    fabric = instance.node.fabric

    def down(self):
        raise DriverError("UFM answered 503 Service Unavailable.")

    monkeypatch.setattr(SimulatedFabric, "read", down)
    run = fabric_reconcile(fabric)
    stored = FabricReconciliation.objects.get(pk=run.pk)
    assert (stored.ok, stored.error, stored.drift) == (False, "UFM answered 503 Service Unavailable.", [])
    assert stored.finished_at is not None
    assert not Incident.objects.exists()


def test_a_pending_vpc_is_pushed_through_by_the_reconciler(world, fleet, monkeypatch):
    fabric = the_fabric()
    actor = Principal(user=world.users["t1_member"], tenant=world.t1.tenant, role=TenantRole.MEMBER)
    vpc = vpc_create(actor=actor, fabric=fabric, name=unique("v"))
    assert vpc.state == VPCState.PENDING and vpc.pkey not in fabric_driver_for(fabric).read()
    run = fabric_reconcile(fabric)
    assert run.ok
    assert VPC.objects.get(pk=vpc.pk).state == VPCState.ACTIVE
    assert vpc.pkey in fabric_driver_for(fabric).read()


#
# Regressions: bugs the invariant work found (a deleting VPC revived, one stuck VPC stopping all
# repair, the leaving grace sheltering a port another tenant now holds)
#


def active_vpc(world, side="t1", **extra) -> VPC:
    actor = Principal(user=world.side(side).owner, tenant=world.side(side).tenant, role=TenantRole.OWNER)
    vpc = vpc_create(actor=actor, fabric=the_fabric(), name=unique("v"), **extra)
    assert vpc_sync(vpc.pk) == VPCState.ACTIVE
    return VPC.objects.get(pk=vpc.pk)


def test_a_vpc_being_deleted_is_not_brought_back_to_life_after_a_fabric_refusal(world, fleet, settings):
    fabric = the_fabric()
    vpc = active_vpc(world)
    vpc_delete(actor=Principal(user=world.t1.owner, tenant=world.t1.tenant, role=TenantRole.OWNER), vpc=vpc)
    settings.MERIDIAN_SIMULATION = {**settings.MERIDIAN_SIMULATION, "broken_rate": {"delete_partition": 1.0}}
    vpc_sync(vpc.pk)  # the fabric refuses for good: the VPC is parked in error
    settings.MERIDIAN_SIMULATION = {**settings.MERIDIAN_SIMULATION, "broken_rate": {}}
    run = fabric_reconcile(fabric)  # the fabric works again
    assert run.ok
    # The tenant asked for it to go: it must end deleted (its partition gone), not active again.
    assert VPC.objects.get(pk=vpc.pk).state in (VPCState.DELETING, VPCState.DELETED)
    assert VPC.objects.get(pk=vpc.pk).state != VPCState.ACTIVE


def test_one_vpc_the_fabric_will_not_delete_does_not_stop_drift_repair(world, fleet, settings):
    fabric = the_fabric()
    stuck, other = active_vpc(world, "t1"), active_vpc(world, "t2")
    vpc_delete(actor=Principal(user=world.t1.owner, tenant=world.t1.tenant, role=TenantRole.OWNER), vpc=stuck)
    stranger = idle_port(fabric)
    inject_member(fabric, other.pkey, stranger, FULL)
    settings.MERIDIAN_SIMULATION = {**settings.MERIDIAN_SIMULATION, "failure_rate": {"delete_partition": 1.0}}
    fabric_reconcile(fabric)
    # The foreign port must go at once, whatever the state of an unrelated deletion.
    assert stranger not in fabric_driver_for(fabric).read()[other.pkey].members


def test_the_leaving_grace_does_not_cover_a_port_now_live_in_another_tenants_vpc(world, fleet):
    fabric = the_fabric()
    before, now_theirs = active_vpc(world, "t1"), active_vpc(world, "t2")
    node = Node.objects.filter(fabric=fabric, pool="bare_metal").order_by("hostname").first()
    guid = node.ib_ports.order_by("index").first().guid
    old = Instance.objects.create(tenant=world.t1.tenant, reservation=make_reservation(world, side="t1",
                                  state="released"), node=node, index=0, kind="bare_metal", state="released",
                                  name=unique("old"))
    new = Instance.objects.create(tenant=world.t2.tenant, reservation=make_reservation(world, side="t2",
                                  state="active"), node=node, index=0, kind="bare_metal", state="active",
                                  name=unique("new"))
    # The port left tenant 1's VPC 30 s ago (its release proved it gone), and joined tenant 2's.
    PortMembership.objects.create(vpc=before, instance=old, guid=guid, address="10.128.0.1",
                                  left_at=timezone.now() - timedelta(seconds=30))
    PortMembership.objects.create(vpc=now_theirs, instance=new, guid=guid, address="10.128.0.1")
    driver = fabric_driver_for(fabric)
    driver.set_members(now_theirs.pkey, {guid: FULL})
    inject_member(fabric, before.pkey, guid, FULL)  # then drift puts it back in tenant 1's partition
    assert isolation_violations(fabric) == [f"port {guid} is in partitions of 2 owners"]
    run = fabric_reconcile(fabric)
    assert run.ok
    assert isolation_violations(fabric) == []
