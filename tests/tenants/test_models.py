"""
Model invariants held by the database (constraints) and by ``clean()``: each rule refuses the bad
row and accepts its nearest good neighbour, so a rule that is missing or too broad shows.
"""

import uuid
from decimal import Decimal

import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from cloud.choices import IsolationMode, OfferingKind, SwitchTier
from cloud.models import GPU, PKEY_MAX, PKEY_MIN, Fabric, GPUModel, Node, Offering, Region, Switch
from tenants.choices import QuotaResource, TeamRole, TenantRole, TokenScope
from tenants.models import APIToken, Membership, Quota, Team, TeamMembership, Tenant, User
from tests.world import small_fleet, unique


def refused(create) -> bool:
    """Whether the database refuses ``create()`` with an IntegrityError (rolled back on its own)."""
    try:
        with transaction.atomic():
            create()
    except IntegrityError:
        return True
    return False


@pytest.fixture
def tenant(db) -> Tenant:
    return Tenant.objects.create(name="Acme", slug=unique("acme"))


@pytest.fixture
def other_tenant(db) -> Tenant:
    return Tenant.objects.create(name="Other", slug=unique("other"))


@pytest.fixture
def gpu_model(db) -> GPUModel:
    return GPUModel.objects.create(slug=unique("gpu"), name="Test GPU", memory_gib=80,
                                   memory_bandwidth_tbs="3.35", fp16_tflops="989.4", mig_max_instances=7,
                                   tdp_watts=700)


@pytest.fixture
def other_gpu_model(db) -> GPUModel:
    return GPUModel.objects.create(slug=unique("gpu"), name="Other GPU", memory_gib=48,
                                   memory_bandwidth_tbs="0.86", fp16_tflops="181.0", mig_max_instances=0,
                                   tdp_watts=300)


#
# Users, teams, memberships
#


def test_user_email_is_unique_regardless_of_case(db):
    """Two rows whose addresses differ only in case are refused by the database itself."""
    User.objects.create(email="Ada@Example.com")
    assert refused(lambda: User.objects.create(email="ada@example.com"))
    assert refused(lambda: User.objects.create(email="ADA@EXAMPLE.COM"))
    assert not refused(lambda: User.objects.create(email="ada2@example.com"))


def test_create_user_stores_the_email_lower_case(db):
    """The manager keeps addresses lower-case, so sign-in and uniqueness agree."""
    user = User.objects.create_user("Grace.Hopper@Example.COM", "a-long-Passphrase-42")
    assert user.email == "grace.hopper@example.com"
    assert User.objects.get_by_natural_key("GRACE.HOPPER@example.com") == user


def test_team_slug_is_unique_per_tenant(tenant, other_tenant):
    """The same slug twice in one tenant is refused; in another tenant it is fine."""
    Team.objects.create(tenant=tenant, name="Vision", slug="vision")
    assert refused(lambda: Team.objects.create(tenant=tenant, name="Vision 2", slug="vision"))
    assert not refused(lambda: Team.objects.create(tenant=other_tenant, name="Vision", slug="vision"))
    assert Team.objects.filter(slug="vision").count() == 2


def test_membership_is_unique_per_user_and_tenant(tenant, other_tenant):
    """A user has one role per tenant: a second membership there is refused, one elsewhere is fine."""
    user = User.objects.create_user(f"{unique('m')}@example.com")
    Membership.objects.create(tenant=tenant, user=user, role=TenantRole.MEMBER)
    assert refused(lambda: Membership.objects.create(tenant=tenant, user=user, role=TenantRole.ADMIN))
    assert not refused(lambda: Membership.objects.create(tenant=other_tenant, user=user, role=TenantRole.ADMIN))


def test_membership_role_outside_the_enum_is_refused(tenant):
    """The role column only holds the four tenant roles."""
    user = User.objects.create_user(f"{unique('r')}@example.com")
    assert refused(lambda: Membership.objects.create(tenant=tenant, user=user, role="superuser"))


def test_team_membership_is_unique_per_user_and_team(tenant):
    """One row per user and team, and only the two team roles."""
    user = User.objects.create_user(f"{unique('tm')}@example.com")
    team = Team.objects.create(tenant=tenant, name="T", slug=unique("t"))
    TeamMembership.objects.create(team=team, user=user, role=TeamRole.MEMBER)
    assert refused(lambda: TeamMembership.objects.create(team=team, user=user, role=TeamRole.ADMIN))
    other = Team.objects.create(tenant=tenant, name="U", slug=unique("u"))
    assert refused(lambda: TeamMembership.objects.create(team=other, user=user, role="owner"))


#
# Quotas
#


def test_quota_may_name_a_gpu_model_only_for_gpus(tenant, gpu_model):
    """A VPC or instance quota with a GPU model is refused by the check constraint and by clean()."""
    assert refused(lambda: Quota.objects.create(tenant=tenant, resource=QuotaResource.VPCS, gpu_model=gpu_model,
                                                limit=1))
    assert refused(lambda: Quota.objects.create(tenant=tenant, resource=QuotaResource.INSTANCES,
                                                gpu_model=gpu_model, limit=1))
    assert not refused(lambda: Quota.objects.create(tenant=tenant, resource=QuotaResource.GPUS,
                                                    gpu_model=gpu_model, limit=1))
    with pytest.raises(ValidationError) as caught:
        Quota(tenant=tenant, resource=QuotaResource.VPCS, gpu_model=gpu_model, limit=1).full_clean()
    assert "gpu_model" in caught.value.message_dict


def test_quota_resource_outside_the_enum_is_refused(tenant):
    """Only gpus, vpcs and instances can be limited."""
    assert refused(lambda: Quota.objects.create(tenant=tenant, resource="disks", limit=1))


def test_quota_one_tenant_row_per_resource(tenant, other_tenant):
    """(tenant, resource) with no team and no model is unique; another tenant or resource is fine."""
    Quota.objects.create(tenant=tenant, resource=QuotaResource.GPUS, limit=8)
    assert refused(lambda: Quota.objects.create(tenant=tenant, resource=QuotaResource.GPUS, limit=9))
    assert not refused(lambda: Quota.objects.create(tenant=tenant, resource=QuotaResource.VPCS, limit=9))
    assert not refused(lambda: Quota.objects.create(tenant=other_tenant, resource=QuotaResource.GPUS, limit=9))


def test_quota_one_tenant_row_per_gpu_model(tenant, gpu_model, other_gpu_model):
    """(tenant, gpus, model) is unique, and may sit beside the tenant's overall GPU row."""
    Quota.objects.create(tenant=tenant, resource=QuotaResource.GPUS, limit=64)
    Quota.objects.create(tenant=tenant, resource=QuotaResource.GPUS, gpu_model=gpu_model, limit=8)
    assert refused(lambda: Quota.objects.create(tenant=tenant, resource=QuotaResource.GPUS, gpu_model=gpu_model,
                                                limit=9))
    assert not refused(lambda: Quota.objects.create(tenant=tenant, resource=QuotaResource.GPUS,
                                                    gpu_model=other_gpu_model, limit=9))


def test_quota_one_team_row_per_resource(tenant):
    """(team, resource) with no model is unique, and may sit beside the tenant's row for it."""
    team = Team.objects.create(tenant=tenant, name="T", slug=unique("t"))
    other_team = Team.objects.create(tenant=tenant, name="U", slug=unique("u"))
    Quota.objects.create(tenant=tenant, resource=QuotaResource.GPUS, limit=64)
    Quota.objects.create(tenant=tenant, team=team, resource=QuotaResource.GPUS, limit=16)
    assert refused(lambda: Quota.objects.create(tenant=tenant, team=team, resource=QuotaResource.GPUS, limit=17))
    assert not refused(lambda: Quota.objects.create(tenant=tenant, team=other_team, resource=QuotaResource.GPUS,
                                                    limit=17))


def test_quota_one_team_row_per_gpu_model(tenant, gpu_model, other_gpu_model):
    """(team, gpus, model) is unique, and may sit beside the team's overall GPU row."""
    team = Team.objects.create(tenant=tenant, name="T", slug=unique("t"))
    Quota.objects.create(tenant=tenant, team=team, resource=QuotaResource.GPUS, limit=16)
    Quota.objects.create(tenant=tenant, team=team, resource=QuotaResource.GPUS, gpu_model=gpu_model, limit=4)
    assert refused(lambda: Quota.objects.create(tenant=tenant, team=team, resource=QuotaResource.GPUS,
                                                gpu_model=gpu_model, limit=5))
    assert not refused(lambda: Quota.objects.create(tenant=tenant, team=team, resource=QuotaResource.GPUS,
                                                    gpu_model=other_gpu_model, limit=5))


def test_quota_limit_cannot_be_negative(tenant):
    """The limit column is a positive integer."""
    assert refused(lambda: Quota.objects.create(tenant=tenant, resource=QuotaResource.VPCS, limit=-1))


def test_quota_team_of_another_tenant_fails_clean(tenant, other_tenant):
    """A quota's team must belong to the quota's tenant."""
    team = Team.objects.create(tenant=other_tenant, name="T", slug=unique("t"))
    with pytest.raises(ValidationError) as caught:
        Quota(tenant=tenant, team=team, resource=QuotaResource.GPUS, limit=1).full_clean()
    assert "team" in caught.value.message_dict


#
# API tokens
#


def _token(**fields) -> APIToken:
    defaults = {"name": "t", "scope": TokenScope.READ, "prefix": uuid.uuid4().hex[:12], "digest": "0" * 64}
    return APIToken.objects.create(**(defaults | fields))


def test_token_bound_to_a_team_needs_a_tenant(tenant):
    """A team-bound token without a tenant is refused; with its tenant it is fine."""
    user = User.objects.create_user(f"{unique('tok')}@example.com")
    team = Team.objects.create(tenant=tenant, name="T", slug=unique("t"))
    assert refused(lambda: _token(user=user, tenant=None, team=team))
    assert not refused(lambda: _token(user=user, tenant=tenant, team=team))
    assert not refused(lambda: _token(user=user, tenant=None, team=None))


def test_token_prefix_is_unique_and_scope_is_an_enum(tenant):
    """Two tokens cannot share a lookup prefix; a scope outside read/read_write is refused."""
    user = User.objects.create_user(f"{unique('tok')}@example.com")
    _token(user=user, tenant=tenant, prefix="abcdef012345")
    assert refused(lambda: _token(user=user, tenant=tenant, prefix="abcdef012345"))
    assert refused(lambda: _token(user=user, tenant=tenant, scope="admin"))


#
# Inventory
#


def _fabric(region: Region, **fields) -> Fabric:
    return Fabric.objects.create(region=region, name="f", slug=fields.pop("slug", unique("ib")), **fields)


@pytest.mark.parametrize(("pkey_min", "pkey_max"), [
    (0x0000, PKEY_MAX),  # below the pool
    (PKEY_MIN, 0x7FFF),  # the default partition
    (PKEY_MIN, 0xFFFF),  # a full-membership key
    (0x0100, 0x00FF),  # empty range
])
def test_fabric_pkey_pool_outside_the_partition_range_is_refused(db, pkey_min, pkey_max):
    """A fabric's P_Key pool must lie within 0x0001-0x7FFE and not be inverted."""
    region = Region.objects.create(slug=unique("r"), name="R")
    assert refused(lambda: _fabric(region, pkey_min=pkey_min, pkey_max=pkey_max))


def test_fabric_pkey_pool_at_the_bounds_is_accepted(db):
    """The full pool 0x0001-0x7FFE and a single key are valid."""
    region = Region.objects.create(slug=unique("r"), name="R")
    assert not refused(lambda: _fabric(region))
    assert not refused(lambda: _fabric(region, pkey_min=PKEY_MIN, pkey_max=PKEY_MAX))
    assert not refused(lambda: _fabric(region, pkey_min=0x0042, pkey_max=0x0042))


def _offering(gpu_model: GPUModel, **fields) -> Offering:
    values = {
        "slug": unique("offer"), "name": "o", "kind": OfferingKind.VM, "gpu_model": gpu_model, "gpus_per_unit": 1,
        "slots_per_gpu": 1, "price_per_gpu_hour": Decimal("2.5000"),
    } | fields
    return Offering(**values)


@pytest.mark.parametrize(("fields", "ok"), [
    ({"kind": OfferingKind.BARE_METAL, "gpus_per_unit": 8}, True),
    ({"kind": OfferingKind.BARE_METAL, "gpus_per_unit": 4}, True),  # a node shape: 4-GPU trays
    ({"kind": OfferingKind.BARE_METAL, "gpus_per_unit": 16}, True),
    ({"kind": OfferingKind.BARE_METAL, "gpus_per_unit": 8, "slots_per_gpu": 2}, False),
])
def test_bare_metal_offering_sells_whole_nodes_of_its_shape(gpu_model, fields, ok):
    """Bare metal is whole nodes of 1 to 16 GPUs, one slot per GPU, nothing else."""
    assert refused(lambda: _offering(gpu_model, **fields).save()) is not ok


@pytest.mark.parametrize(("fields", "ok"), [
    ({"kind": OfferingKind.CONTAINER, "gpus_per_unit": 1, "slots_per_gpu": 7}, True),
    ({"kind": OfferingKind.CONTAINER, "gpus_per_unit": 2, "slots_per_gpu": 7}, False),
    ({"kind": OfferingKind.VM, "gpus_per_unit": 1, "slots_per_gpu": 2}, False),
    ({"kind": OfferingKind.VM, "gpus_per_unit": 4, "slots_per_gpu": 1}, True),
])
def test_fractional_offering_only_for_single_gpu_containers(gpu_model, fields, ok):
    """slots_per_gpu > 1 only on container offerings of one GPU per unit."""
    assert refused(lambda: _offering(gpu_model, **fields).save()) is not ok


def test_spot_offering_needs_a_floor_price(gpu_model):
    """Spot without a floor price is refused by the database and by clean(); with one it is fine."""
    assert refused(lambda: _offering(gpu_model, spot_available=True, spot_floor_price=None).save())
    with pytest.raises(ValidationError) as caught:
        _offering(gpu_model, spot_available=True, spot_floor_price=None).full_clean()
    assert "spot_floor_price" in caught.value.message_dict
    assert not refused(lambda: _offering(gpu_model, spot_available=True, spot_floor_price=Decimal("1.0")).save())


def test_spot_floor_above_on_demand_price_fails_clean(gpu_model):
    """The spot floor cannot exceed the on-demand price."""
    offering = _offering(gpu_model, spot_available=True, spot_floor_price=Decimal("3.0"),
                         price_per_gpu_hour=Decimal("2.0"))
    with pytest.raises(ValidationError) as caught:
        offering.full_clean()
    assert "spot_floor_price" in caught.value.message_dict


def test_mig_isolation_on_a_model_without_mig_fails_clean(gpu_model, other_gpu_model):
    """MIG partitions need a MIG-capable GPU model; the same offering on one that supports MIG is clean."""
    assert not other_gpu_model.supports_mig
    offering = _offering(other_gpu_model, kind=OfferingKind.CONTAINER, isolation_mode=IsolationMode.MIG,
                         slots_per_gpu=7)
    with pytest.raises(ValidationError) as caught:
        offering.full_clean()
    assert "isolation_mode" in caught.value.message_dict

    _offering(gpu_model, kind=OfferingKind.CONTAINER, isolation_mode=IsolationMode.MIG, slots_per_gpu=7).full_clean()


@pytest.fixture
def fleet(db) -> list[Node]:
    return small_fleet(nodes=2)


@pytest.fixture
def elsewhere(fleet) -> tuple[Region, Fabric, Switch]:
    """A second region with its own fabric and leaf switch."""
    region = Region.objects.create(slug=unique("r"), name="Elsewhere")
    fabric = _fabric(region)
    leaf = Switch.objects.create(fabric=fabric, name=unique("leaf"), tier=SwitchTier.LEAF)
    return region, fabric, leaf


def test_node_in_a_fabric_of_another_region_fails_clean(fleet, elsewhere):
    """A node's fabric must be in the node's region."""
    node = fleet[0]
    node.full_clean()
    _, fabric, leaf = elsewhere
    node.fabric, node.leaf = fabric, leaf
    with pytest.raises(ValidationError) as caught:
        node.full_clean()
    assert "fabric" in caught.value.message_dict


def test_node_on_a_leaf_of_another_fabric_fails_clean(fleet, elsewhere):
    """A node's leaf switch must be on the node's fabric."""
    node = fleet[0]
    _, _, leaf = elsewhere
    node.leaf = leaf
    with pytest.raises(ValidationError) as caught:
        node.full_clean()
    assert "leaf" in caught.value.message_dict
    assert "fabric" not in caught.value.message_dict


def test_gpu_index_is_unique_per_node(fleet):
    """Two GPUs of one node cannot share an index; the same index on another node is fine."""
    first, second = fleet[0], fleet[1]
    taken = first.gpus.get(index=0)

    def gpu(node, index, bus):
        return GPU.objects.create(node=node, index=index, uuid=f"GPU-{uuid.uuid4()}", serial=uuid.uuid4().hex[:13],
                                  pci_bus_id=bus, model=taken.model, memory_mib=taken.memory_mib)

    assert refused(lambda: gpu(first, 0, "00000000:FF:00.0"))
    assert refused(lambda: gpu(first, 9, taken.pci_bus_id))  # (node, pci_bus_id) is unique too
    assert not refused(lambda: gpu(first, 9, "00000000:FF:00.0"))
    second.gpus.filter(index=0).delete()
    assert not refused(lambda: gpu(second, 0, "00000000:FE:00.0"))


def test_node_sizes_must_be_positive(fleet):
    """A node with no CPU cores or RAM is refused."""
    assert refused(lambda: Node.objects.filter(pk=fleet[0].pk).update(cpu_cores=0))
    assert refused(lambda: Node.objects.filter(pk=fleet[0].pk).update(ram_gib=0))
