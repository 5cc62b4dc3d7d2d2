"""
Instance addresses: every instance gets a private address from its region's pool, a public one
when its reservation asks, and a DNS name; they go back once it is cleaned. An address never has
two live owners, however many starts race for it; a full pool makes the reservation wait, saying so.
"""

import ipaddress
import threading

import pytest
from django.db import connections, transaction

from cloud.models import Node
from provisioning import addresses
from provisioning.lifecycle import tick as ticking
from provisioning.models import AddressAssignment, Instance, Reservation
from tests.provisioning.factories import make_reservation, offering
from tests.provisioning.pipeline import SSH_KEY, reservation
from tests.world import small_fleet

URL = "/api/v1/reservations/"


@pytest.fixture
def fleet(world):
    Reservation.objects.all().delete()
    return small_fleet(4)


def reserve(world, **extra):
    body = {"name": "job", "offering": offering("bare_metal", 8).slug, "regions": ["us-east-1"],
            "duration_hours": 2, "nodes": 1, "ssh_public_key": SSH_KEY, **extra}
    response = world.client("t1_member").post(URL, body, format="json")
    assert response.status_code == 201, response.json()
    return response.json()["id"]


def test_an_instance_gets_a_private_address_a_public_one_when_asked_and_a_dns_name(world, fleet, steps, settings):
    pk = reserve(world, public_ip=True)
    steps.run()
    assert reservation(pk).state == "active"
    instance = Instance.objects.get(reservation_id=pk)
    assert ipaddress.ip_address(instance.private_ip) in addresses.pool("us-east-1", "private")
    assert ipaddress.ip_address(instance.public_ip) in addresses.pool("us-east-1", "public")
    assert instance.address == f"{instance.name}.{world.t1.tenant.slug}.us-east-1.{settings.MERIDIAN_DNS_ZONE}"
    shown = world.client("t1_member").get(f"/api/v1/instances/{instance.pk}/").json()
    assert shown["ssh_command"] == f"ssh ubuntu@{instance.public_ip}"
    assert (shown["private_ip"], shown["public_ip"], shown["address"]) == (
        instance.private_ip, instance.public_ip, instance.address)


def test_without_a_public_address_the_dns_name_is_what_one_logs_in_to(world, fleet, steps):
    pk = reserve(world)
    steps.run()
    instance = Instance.objects.get(reservation_id=pk)
    assert instance.public_ip is None and instance.private_ip
    assert world.client("t1_member").get(f"/api/v1/instances/{instance.pk}/").json()["ssh_command"] == (
        f"ssh ubuntu@{instance.address}")


def test_the_addresses_go_back_once_the_instance_is_cleaned(world, fleet, steps):
    pk = reserve(world, public_ip=True)
    steps.run()
    instance = Instance.objects.get(reservation_id=pk)
    assert AddressAssignment.objects.filter(instance=instance, released_at__isnull=True).count() == 2
    assert world.client("t1_member").post(f"{URL}{pk}/release/").status_code == 200
    steps.run()
    assert reservation(pk).state == "released"
    assert not AddressAssignment.objects.filter(instance=instance, released_at__isnull=True).exists()
    assert AddressAssignment.objects.filter(instance=instance).count() == 2  # history kept


def test_a_full_pool_makes_the_reservation_wait_saying_why_then_it_starts(world, fleet, steps, settings):
    settings.MERIDIAN_ADDRESS_POOLS = {"default": {"private": "10.99.0.0/30", "public": "198.18.0.0/20"}}
    first = reserve(world)
    steps.run()
    second = reserve(world)  # 10.99.0.1 and .2 are the pool; the first took one
    steps.run()
    third = reserve(world)
    steps.run()
    assert [reservation(pk).state for pk in (first, second)] == ["active", "active"]
    waiting = reservation(third)
    assert waiting.state == "scheduled" and "Waiting for a free private address in us-east-1" in waiting.state_reason
    assert not Instance.objects.filter(reservation_id=third).exists()
    world.client("t1_member").post(f"{URL}{first}/release/")
    steps.run()
    ticking.tick()
    steps.run()
    assert reservation(third).state == "active", reservation(third).state_reason


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("prefix, winners", [(26, 50), (27, 30)])
def test_50_starts_racing_for_addresses_never_share_one(world, settings, prefix, winners):
    """50 threads, each assigning one instance's address at once: distinct addresses, the rest told the pool is full."""
    settings.MERIDIAN_ADDRESS_POOLS = {"default": {"private": f"10.77.0.0/{prefix}", "public": "198.18.0.0/20"}}
    small_fleet(4)
    node = Node.objects.order_by("hostname").first()
    held = make_reservation(world)
    instances = Instance.objects.bulk_create(
        Instance(tenant_id=held.tenant_id, reservation=held, node=node, index=i, kind="vm", name=f"race-{i}")
        for i in range(50))
    outcomes, errors, gate = [], [], threading.Barrier(50)

    def start(instance):
        try:
            gate.wait()
            with transaction.atomic():
                addresses.assign([instance], region="us-east-1", public=False, tenant_slug="t1")
            outcomes.append("assigned")
        except addresses.PoolExhausted:
            outcomes.append("full")
        except Exception as exc:  # noqa: BLE001 -- anything else fails the test below
            errors.append(repr(exc))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=start, args=(instance,)) for instance in instances]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert outcomes.count("assigned") == winners and outcomes.count("full") == 50 - winners
    live = list(AddressAssignment.objects.filter(released_at__isnull=True).values_list("address", flat=True))
    assert len(live) == len(set(live)) == winners
    assert sorted(Instance.objects.exclude(private_ip=None).values_list("private_ip", flat=True)) == sorted(live)
