"""
An instance records which GPUs of its host it got and how they are linked, shows it in the API
and the console, and a VM's vCPUs and memory come from its GPUs' NUMA node: on the small fleet's
HGX hosts, a 2-GPU VM created after a 1-GPU one gets a pair under one PCIe switch beside it.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest
from django.test import Client

from provisioning.drivers.simulated import SimulatedVM
from provisioning.lifecycle.steps import target_of
from provisioning.models import Instance, Reservation
from tests.provisioning.pipeline import SSH_KEY
from tests.world import small_fleet, vm_offering
from web.console import SESSION_TENANT

URL = "/api/v1/reservations/"


@pytest.fixture
def fleet(world):
    Reservation.objects.all().delete()  # the world's own queued work would compete
    return small_fleet(4)


def create(world, gpus: int) -> str:
    response = world.client("t1_member").post(URL, {
        "name": "job", "offering": vm_offering(gpus).slug, "regions": ["us-east-1"], "duration_hours": 2,
        "ssh_public_key": SSH_KEY, "gpus": gpus}, format="json")
    assert response.status_code == 201, response.json()
    assert response.json()["state"] == "scheduled"
    return response.json()["id"]


def test_a_vm_records_its_gpus_link_and_numa_node_and_runs_there(world, fleet, steps):
    first = create(world, 1)
    steps.run()
    pair = create(world, 2)
    steps.run()
    one = Instance.objects.get(reservation_id=first)
    two = Instance.objects.get(reservation_id=pair)
    assert one.topology == {"gpus": [0], "link": None, "numa_node": 0}
    # GPU 1 (beside the first VM's) stays for a 1-GPU VM; 2 and 3 share a PCIe switch on NUMA node 0.
    assert two.topology == {"gpus": [2, 3], "link": "nvlink", "numa_node": 0}
    assert [d["index"] for d in two.devices] == [2, 3]

    body = world.client("t1_member").get(f"/api/v1/instances/{two.pk}/").json()
    assert body["topology"] == {"gpus": [2, 3], "link": "nvlink", "numa_node": 0}

    xml = SimulatedVM()._state(target_of(two.node))["domains"][two.name]["xml"]
    domain = ET.fromstring(xml)  # noqa: S314 -- XML built by the define step
    assert domain.find("vcpu").attrib == {"placement": "static", "cpuset": "0-55"}  # NUMA node 0's cores
    assert domain.find("numatune/memory").attrib == {"mode": "strict", "nodeset": "0"}

    console = Client()
    console.force_login(world.users["t1_member"])
    session = console.session
    session[SESSION_TENANT] = world.t1.tenant.slug
    session.save()
    page = console.get(f"/reservations/{pair}/")
    assert page.status_code == 200
    assert "linked by NVLink" in page.content.decode() and "NUMA node 0" in page.content.decode()


def test_several_vms_of_one_request_split_into_best_linked_sets(world, fleet, steps):
    response = world.client("t1_member").post(URL, {
        "name": "job", "offering": vm_offering(2).slug, "regions": ["us-east-1"], "duration_hours": 2,
        "ssh_public_key": SSH_KEY, "gpus": 8}, format="json")
    assert response.status_code == 201, response.json()
    steps.run()
    units = Instance.objects.filter(reservation_id=response.json()["id"]).order_by("index")
    assert [u.topology["gpus"] for u in units] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert {u.topology["link"] for u in units} == {"nvlink"} and [u.topology["numa_node"] for u in units] == [
        0, 0, 1, 1]
