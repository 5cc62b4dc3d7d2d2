"""
IB-VPCs end to end: created through the API (P_Key drawn, subnet chosen or checked, quota),
programmed on the fabric, joined by provisioning (a server's HCA ports, a VM's virtual function)
and left on release with the fabric's read-back as proof; deleted only when unused; reservations
that name one are placed on its fabric. The fabric is the simulated one unless a test configures
OpenSM (a partitions.conf in a temporary folder) or UFM (the local UFM server of ufm_server.py).
"""

from __future__ import annotations

import pytest

from cloud.fleet import FleetSpec, build_fleet
from cloud.models import Fabric, HCAPort, Node
from provisioning.drivers import fabric_driver_for
from provisioning.drivers.fabric import DEFAULT_PKEY, FULL, LIMITED
from provisioning.drivers.opensm import parse
from provisioning.drivers.simulated import SimulatedFabric
from provisioning.drivers.simulated_devices import trust_simulated_fleet
from provisioning.models import VPC, Instance, PortMembership, Reservation, VirtualFunction
from provisioning.networks.ports import isolation_violations, still_members
from provisioning.networks.vpcs import vpc_sync
from tenants.choices import QuotaResource
from tenants.models import Quota
from tests.provisioning.factories import offering
from tests.provisioning.pipeline import SSH_KEY, reservation
from tests.provisioning.ufm_server import UFMServer
from tests.world import small_fleet, vm_offering

VPCS, RESERVATIONS = "/api/v1/vpcs/", "/api/v1/reservations/"


@pytest.fixture
def fleet(world):
    Reservation.objects.all().delete()  # the world's own queued work would compete
    return small_fleet(4)


def make_vpc(world, persona="t1_member", **body):
    response = world.client(persona).post(VPCS, {"name": "train", "region": "us-east-1", **body}, format="json")
    assert response.status_code == 201, response.json()
    return response.json()


def provision(world, steps, chosen, persona="t1_member", **amount):
    response = world.client(persona).post(RESERVATIONS, {
        "name": "job", "offering": chosen.slug, "regions": ["us-east-1"], "duration_hours": 2,
        "ssh_public_key": SSH_KEY, **amount}, format="json")
    assert response.status_code == 201, response.json()
    steps.run()
    assert reservation(response.json()["id"]).state == "active"
    return response.json()["id"]


def release(world, steps, pk, persona="t1_member"):
    assert world.client(persona).post(f"{RESERVATIONS}{pk}/release/").status_code in (200, 202)
    steps.run()
    assert reservation(pk).state == "released"


def fabric_of(pk) -> Fabric:
    return Instance.objects.filter(reservation_id=pk).first().node.fabric


#
# Creating and deleting
#


def test_a_vpc_gets_the_lowest_free_pkey_and_a_free_subnet_then_its_partition(world, fleet):
    fabric = fleet[0].fabric
    first, second = make_vpc(world), make_vpc(world, name="eval")
    assert (first["pkey"], second["pkey"]) == (f"{fabric.pkey_min:#06x}", f"{fabric.pkey_min + 1:#06x}")
    assert (first["cidr"], second["cidr"]) == ("10.128.0.0/24", "10.128.1.0/24")  # never overlapping
    assert first["state"] == "pending" and first["fabric"] == fabric.slug and not first["is_default"]
    assert vpc_sync(first["id"]) == "active"
    partition = fabric_driver_for(fabric).read()[fabric.pkey_min]
    assert partition.members == {} and partition.spec.mtu == 4096
    listed = world.client("t1_viewer").get(VPCS).json()["results"]
    assert {v["name"] for v in listed} == {"train", "eval"}
    assert world.client("t2_member").get(VPCS).json()["results"] == []


def test_a_subnet_is_per_tenant_and_a_pkey_per_fabric(world, fleet):
    mine = make_vpc(world, cidr="10.50.0.0/24")
    theirs = make_vpc(world, persona="t2_member", cidr="10.50.0.0/24")  # another tenant: the same subnet is fine
    assert mine["pkey"] != theirs["pkey"]


def test_the_vpc_quota_is_a_409_with_the_numbers(world, fleet):
    Quota.objects.create(tenant=world.t1.tenant, resource=QuotaResource.VPCS, limit=1)
    make_vpc(world)
    response = world.client("t1_member").post(VPCS, {"name": "second", "region": "us-east-1"}, format="json")
    assert response.status_code == 409
    error = response.json()["errors"][0]
    assert error["code"] == "quota_exceeded" and error["meta"] == {
        "scope": "tenant", "resource": "vpcs", "limit": 1, "in_use": 1, "asked": 1}
    assert VPC.objects.filter(tenant=world.t1.tenant).count() == 1


def test_a_full_pool_is_a_clean_409(world, fleet):
    fabric = fleet[0].fabric
    Fabric.objects.filter(pk=fabric.pk).update(pkey_min=0x10, pkey_max=0x11)
    make_vpc(world, name="a"), make_vpc(world, name="b")
    response = world.client("t1_member").post(VPCS, {"name": "c", "region": "us-east-1"}, format="json")
    assert response.status_code == 409 and response.json()["errors"][0]["code"] == "pkey_pool_exhausted"
    assert VPC.objects.count() == 2


def test_a_vpc_in_use_cannot_be_deleted_and_its_pkey_returns_only_once_the_fabric_confirms(world, fleet, steps):
    vpc = make_vpc(world)
    vpc_sync(vpc["id"])
    pk = provision(world, steps, vm_offering(1), gpus=1, vpc=vpc["id"])
    busy = world.client("t1_member").delete(f"{VPCS}{vpc['id']}/")
    assert busy.status_code == 409 and busy.json()["errors"][0]["code"] == "vpc_in_use"
    release(world, steps, pk)
    deleting = world.client("t1_member").delete(f"{VPCS}{vpc['id']}/")
    assert deleting.status_code == 202 and deleting.json()["state"] == "deleting"
    fabric = Fabric.objects.get(slug=vpc["fabric"])
    taken = make_vpc(world, name="next")
    assert taken["pkey"] != vpc["pkey"]  # still held: the fabric has not confirmed yet
    assert vpc_sync(vpc["id"]) == "deleted"
    assert int(vpc["pkey"], 16) not in fabric_driver_for(fabric).read()
    assert make_vpc(world, name="after")["pkey"] == vpc["pkey"]  # back in the pool
    assert world.client("t1_member").get(VPCS).json()["count"] == 2  # deleted ones on request only
    assert world.client("t1_member").get(f"{VPCS}?state=deleted").json()["count"] == 1


def test_a_fabric_that_refuses_the_partition_parks_the_vpc_in_error(world, fleet, monkeypatch):
    from provisioning.drivers import DriverError

    vpc = make_vpc(world)

    def refuse(self, spec):
        raise DriverError("partition limit reached on this subnet manager", transient=False)

    monkeypatch.setattr(SimulatedFabric, "ensure_partition", refuse)
    assert vpc_sync(vpc["id"]) == "error"
    assert "partition limit reached" in VPC.objects.get(pk=vpc["id"]).state_reason


#
# Joining and leaving through provisioning
#


def test_a_server_joins_the_tenants_default_vpc_with_its_ports_and_leaves_on_release(world, fleet, steps):
    pk = provision(world, steps, offering("bare_metal", 8), nodes=1)
    instance = Instance.objects.get(reservation_id=pk)
    vpc = VPC.objects.get(tenant=world.t1.tenant, is_default=True)
    guids = list(HCAPort.objects.filter(node=instance.node).order_by("index").values_list("guid", flat=True))
    assert len(guids) == 8
    seen = fabric_driver_for(vpc.fabric).read()
    assert {g: seen[vpc.pkey].members.get(g) for g in guids} == {g: FULL for g in guids}
    assert all(seen[DEFAULT_PKEY].members.get(g) == LIMITED for g in guids)  # never full in 0x7fff
    addresses = set(PortMembership.objects.filter(instance=instance).values_list("address", flat=True))
    assert len(addresses) == 8 and all(a.startswith("10.128.0.") for a in addresses)

    members = world.client("t1_viewer").get(f"{VPCS}{vpc.pk}/members/").json()["results"]
    assert [(m["name"], m["ports"]) for m in members] == [(instance.name, 8)]
    assert not any(g in str(members) for g in guids)  # instances, not raw port GUIDs

    release(world, steps, pk)
    assert still_members(fabric_driver_for(vpc.fabric).read(), guids) == []
    assert not PortMembership.objects.filter(instance=instance, left_at__isnull=True).exists()
    assert Node.objects.get(pk=instance.node_id).state == "available"


def test_two_tenants_vms_on_one_host_get_their_own_virtual_functions_and_cannot_reach_each_other(world, fleet, steps):
    host = Node.objects.filter(pool="shared", is_spare=False).order_by("hostname").first()
    Node.objects.filter(pool="shared").exclude(pk=host.pk).update(state="maintenance")  # both land on one host
    mine = [provision(world, steps, vm_offering(1), gpus=1) for _ in range(2)]
    theirs = provision(world, steps, vm_offering(1), persona="t2_member", gpus=1)
    vf = {pk: VirtualFunction.objects.get(instance__reservation_id=pk) for pk in [*mine, theirs]}
    assert {v.port.node_id for v in vf.values()} == {host.pk}
    assert len({v.guid for v in vf.values()}) == 3
    fabric = SimulatedFabric(name=f"{host.region.slug}/{host.fabric.slug}")
    assert fabric.reachable(vf[mine[0]].guid, vf[mine[1]].guid)  # one tenant's VMs: one partition
    assert not fabric.reachable(vf[mine[0]].guid, vf[theirs].guid)
    assert not fabric.reachable(vf[theirs].guid, vf[mine[1]].guid)
    assert isolation_violations(host.fabric) == []

    release(world, steps, mine[0])
    assert VirtualFunction.objects.get(pk=vf[mine[0]].pk).instance is None  # free for the next VM
    assert not fabric.reachable(vf[mine[0]].guid, vf[mine[1]].guid)


def test_a_port_the_fabric_still_shows_after_release_keeps_the_node_out_of_the_pool(world, fleet, steps, monkeypatch):
    pk = provision(world, steps, offering("bare_metal", 8), nodes=1)
    node = Instance.objects.get(reservation_id=pk).node
    monkeypatch.setattr(SimulatedFabric, "remove_members", lambda self, pkey, guids: None)  # a fabric that ignores it
    assert world.client("t1_member").post(f"{RESERVATIONS}{pk}/release/").status_code in (200, 202)
    steps.run()
    node.refresh_from_db()
    assert node.state == "faulty" and "still in partition" in node.state_reason
    runs = Reservation.objects.get(pk=pk).operations.get(kind="release").steps.filter(name="leave_network")
    assert runs.count() >= 2 and all("still in partition" in run.error for run in runs)


#
# Reservations that name a VPC
#


def test_a_reservation_naming_a_vpc_is_placed_on_its_fabric(world, steps):
    Reservation.objects.all().delete()
    build_fleet(FleetSpec(regions=1, nodes_per_fabric=4, fabrics_per_region=2, spare_ratio=0, shared_ratio=0.5))
    trust_simulated_fleet()
    second = Fabric.objects.order_by("slug").last()
    vpc = make_vpc(world, fabric=second.slug)
    pk = provision(world, steps, vm_offering(1), gpus=1, vpc=vpc["id"])
    assert fabric_of(pk) == second
    assert Reservation.objects.get(pk=pk).vpc_id is not None
    assert PortMembership.objects.get(instance__reservation_id=pk).vpc_id == VPC.objects.get(pk=vpc["id"]).pk


@pytest.mark.parametrize("case", ["other-tenant", "deleting", "other-region", "team-vpc-tenant-wide"])
def test_a_reservation_with_an_unusable_vpc_is_a_400_that_writes_nothing(world, fleet, case):
    if case == "other-tenant":
        vpc, code = make_vpc(world, persona="t2_member"), "does_not_exist"
    elif case == "deleting":
        vpc, code = make_vpc(world), "vpc_deleting"
        VPC.objects.filter(pk=vpc["id"]).update(state="deleting")
    elif case == "other-region":
        build_fleet(FleetSpec(regions=1, first_region=1, nodes_per_fabric=4, spare_ratio=0))
        region = Fabric.objects.exclude(region__slug="us-east-1").first().region.slug
        vpc, code = make_vpc(world, region=region), "vpc_region"
    else:
        vpc, code = make_vpc(world, persona="t1_admin", team=str(world.t1.team.pk)), "vpc_team"
    before = Reservation.objects.count()
    response = world.client("t1_admin").post(RESERVATIONS, {
        "name": "job", "offering": vm_offering(1).slug, "regions": ["us-east-1"], "duration_hours": 1, "gpus": 1,
        "vpc": vpc["id"]}, format="json")
    assert response.status_code == 400, response.json()
    assert response.json()["errors"][0]["code"] == code
    assert Reservation.objects.count() == before


#
# The isolation report
#


def test_the_isolation_report_shows_members_the_fabric_and_repairs_without_naming_other_ports(world, fleet, steps):
    from provisioning.networks.ports import fabric_reconcile

    pk = provision(world, steps, offering("bare_metal", 8), nodes=1)
    vpc = VPC.objects.get(tenant=world.t1.tenant, is_default=True)
    intruder = HCAPort.objects.exclude(node__instances__reservation_id=pk).first().guid
    fabric_driver_for(vpc.fabric).set_members(vpc.pkey, {intruder: FULL})
    fabric_reconcile(vpc.fabric)
    report = world.client("t1_viewer").get(f"{VPCS}{vpc.pk}/isolation-report/").json()
    assert report["pkey"] == f"{vpc.pkey:#06x}" and len(report["members"]) == 1
    assert report["fabric_now"] == {"checked": True, "partition_present": True, "members_full": 8,
                                    "members_expected": 8, "foreign_ports": 0, "ports_full_in_default_partition": 0}
    assert report["last_reconciliation"]["drift_found"] == 1
    assert report["last_reconciliation"]["repairs"] == [{"kind": "extra_member", "action": "removed", "ports": 1}]
    assert intruder not in str(report)
    assert world.client("t2_member").get(f"{VPCS}{vpc.pk}/isolation-report/").status_code == 404


#
# Real fabric drivers behind the same pipeline
#


def test_provisioning_through_opensm_writes_the_partition_and_release_removes_it(world, fleet, steps, settings,
                                                                                tmp_path):
    conf = tmp_path / "partitions.conf"
    settings.MERIDIAN_FABRICS = {"default": {"driver": "opensm", "path": str(conf), "reread_command": ["true"]}}
    pk = provision(world, steps, offering("bare_metal", 8), nodes=1)
    vpc = VPC.objects.get(tenant=world.t1.tenant, is_default=True)
    guids = list(Instance.objects.get(reservation_id=pk).node.ib_ports.values_list("guid", flat=True))
    written = conf.read_text()
    assert f"{vpc.partition_name}={vpc.pkey:#06x}" in written
    assert all(f"0x{g}=full" in written for g in guids)
    assert "Default=0x7fff" in written and "ALL=limited" in written
    release(world, steps, pk)
    partitions = parse(conf.read_text())
    assert still_members(partitions, guids) == []


def test_provisioning_through_ufm_joins_and_leaves_by_its_rest_api(world, fleet, steps, settings):
    server = UFMServer(username="meridian", password="ufm-test-password").start()
    try:
        settings.MERIDIAN_FABRICS = {"default": {"driver": "ufm", "url": server.url, "username": "meridian",
                                                 "password": "ufm-test-password", "verify_tls": False}}
        pk = provision(world, steps, vm_offering(1), gpus=1)
        vpc = VPC.objects.get(tenant=world.t1.tenant, is_default=True)
        guid = VirtualFunction.objects.get(instance__reservation_id=pk).guid
        assert fabric_driver_for(vpc.fabric).read()[vpc.pkey].members[guid] == FULL
        release(world, steps, pk)
        assert still_members(fabric_driver_for(vpc.fabric).read(), [guid]) == []
    finally:
        server.stop()


def test_a_late_retry_of_a_release_leaves_the_next_vms_port_alone(world, fleet, steps):
    """A redelivered leave_network after its virtual function went to the next VM must not cut that VM off."""
    from provisioning.networks.ports import ports_leave

    host = Node.objects.filter(pool="shared", is_spare=False).order_by("hostname").first()
    Node.objects.filter(pool="shared").exclude(pk=host.pk).update(state="maintenance")
    first = provision(world, steps, vm_offering(1), gpus=1)
    vf = VirtualFunction.objects.get(instance__reservation_id=first)
    release(world, steps, first)
    second = provision(world, steps, vm_offering(1), persona="t2_member", gpus=1)
    assert VirtualFunction.objects.get(instance__reservation_id=second).pk == vf.pk  # reused
    ports_leave(Instance.objects.get(reservation_id=first))  # the late redelivery
    theirs = VPC.objects.get(tenant=world.t2.tenant, is_default=True)
    assert fabric_driver_for(host.fabric).read()[theirs.pkey].members.get(vf.guid) == FULL


def test_a_join_that_races_a_delete_never_outlives_the_partition(world, fleet, steps):
    """The delete waits while a port is in the VPC; a join finds a VPC being deleted closed to it."""
    from provisioning.drivers import DriverError
    from provisioning.networks.ports import ports_join

    vpc = make_vpc(world)
    vpc_sync(vpc["id"])
    pk = provision(world, steps, vm_offering(1), gpus=1, vpc=vpc["id"])
    VPC.objects.filter(pk=vpc["id"]).update(state="deleting")  # as if the delete had slipped in
    with pytest.raises(DriverError):
        vpc_sync(vpc["id"])  # transient: it waits for the port to leave
    assert VPC.objects.get(pk=vpc["id"]).state == "deleting"
    assert int(vpc["pkey"], 16) in fabric_driver_for(Fabric.objects.get(slug=vpc["fabric"])).read()
    with pytest.raises(DriverError, match="cannot take new members"):
        ports_join(Instance.objects.get(reservation_id=pk), VPC.objects.get(pk=vpc["id"]))


def test_a_second_sync_that_finds_the_work_done_is_not_an_error(world, fleet):
    from provisioning.networks.vpcs import _move

    vpc = VPC.objects.get(pk=make_vpc(world)["id"])
    assert vpc_sync(vpc.pk) == "active"
    _move(vpc, "active", reason="")  # a racing sync got there first
    assert vpc.state == "active"


def test_an_opensm_file_that_grants_membership_by_keyword_fails_closed(tmp_path):
    from provisioning.drivers import DriverError
    from provisioning.drivers.opensm import OpenSMFabric

    conf = tmp_path / "partitions.conf"
    conf.write_text("Default=0x7fff, ipoib : ALL=full, SELF=full;\nvpc_a=0x0001, ipoib : ALL_CAS=full;\n")
    with pytest.raises(DriverError, match="ALL=full in 0x7fff.*ALL_CAS=full in 0x0001") as raised:
        OpenSMFabric(path=str(conf), reread_command=None).read()
    assert not raised.value.transient


def test_a_full_vpc_fails_the_request_not_the_node(world, fleet, steps):
    vpc = make_vpc(world, cidr="10.60.0.0/28")  # 14 addresses: one 8-port server fits, a second does not
    vpc_sync(vpc["id"])
    provision(world, steps, offering("bare_metal", 8), nodes=1, vpc=vpc["id"])
    response = world.client("t1_member").post(RESERVATIONS, {
        "name": "big", "offering": offering("bare_metal", 8).slug, "regions": ["us-east-1"], "duration_hours": 2,
        "nodes": 1, "vpc": vpc["id"]}, format="json")
    steps.run()
    run = Reservation.objects.get(pk=response.json()["id"]).operations.get(kind="provision").steps.get(
        name="join_network")
    assert "no free address" in run.error
    node = Instance.objects.get(reservation_id=response.json()["id"]).node
    node.refresh_from_db()
    assert node.state == "available"  # cleaned and back in the pool: the VPC was full, not the node broken
    assert not PortMembership.objects.filter(instance__node=node, left_at__isnull=True).exists()
