"""
Staff enrol a node with its GPUs: it is stored enrolled with the BMC password encrypted (never
echoed), its validation starts at once, and every bad body is a 400 that writes nothing.
"""

import uuid

import pytest
from django.db import connection

from cloud.models import GPU, Node
from provisioning.models import Operation
from security.crypto import decrypt
from tests.world import small_fleet

URL = "/api/v1/nodes/"
PASSWORD = "bmc-Pa55-enrol-4kq"


@pytest.fixture
def leaf(world):
    small_fleet(4)
    return Node.objects.order_by("hostname").first().leaf


def body(switch, **changes):
    return {"hostname": "gpu-new-0001.us-east-1", "region": "us-east-1", "fabric": switch.fabric.slug,
            "leaf": switch.name, "pool": "bare_metal", "bmc_address": "https://gpu-new-0001-bmc.oob.internal/redfish/v1",
            "bmc_username": "meridian", "bmc_password": PASSWORD, "cpu_cores": 112, "ram_gib": 2048,
            "nvme_tb": "30.72", "gpu_model": "h100-80gb-sxm",
            "gpus": [{"index": i, "uuid": f"GPU-{uuid.uuid4()}", "serial": f"SN{i}{uuid.uuid4().hex[:8]}",
                      "pci_bus_id": f"00000000:{0x18 + i:02x}:00.0"} for i in range(8)],
            "ib_port_guids": [f"0xb83fd2{uuid.uuid4().hex[:10]}" for _ in range(8)],
            "ib_port_pci_bus_ids": [f"00000000:{0x1a + i:02X}:00.0" for i in range(8)], **changes}


def test_an_enrolled_node_is_validated_before_it_is_sold(world, leaf):
    body_sent = body(leaf)
    response = world.client("platform_admin").post(URL, body_sent, format="json")
    assert response.status_code == 201, response.json()
    node = Node.objects.get(pk=response.json()["id"])
    assert node.state == "validating" and node.gpus.count() == 8
    sent = [guid.removeprefix("0x") for guid in body_sent["ib_port_guids"]]
    assert list(node.ib_ports.order_by("index").values_list("guid", flat=True)) == sent
    assert node.ib_ports.get(index=1).pci_bus_id == "00000000:1b:00.0"  # as NVML writes them, lower case
    assert PASSWORD not in response.content.decode() and "bmc_password" not in response.json()
    with connection.cursor() as cursor:
        cursor.execute("SELECT bmc_password FROM cloud_node WHERE id = %s", [node.pk])
        stored = cursor.fetchone()[0]
    assert PASSWORD not in stored and decrypt(stored) == PASSWORD
    assert Operation.objects.get(node=node, kind="validate").state == "pending"


def gpu(leaf, i=0, **changes):
    return {**body(leaf)["gpus"][i], **changes}


BAD = {
    "hostname-invalid": lambda leaf: body(leaf, hostname="GPU node #1"),
    "hostname-10kb": lambda leaf: body(leaf, hostname="a" * 10_000),
    "region-unknown": lambda leaf: body(leaf, region="mars-1"),
    "fabric-unknown": lambda leaf: body(leaf, fabric="no-such-fabric"),
    "leaf-unknown": lambda leaf: body(leaf, leaf="no-such-leaf"),
    "pool-superuser": lambda leaf: body(leaf, pool="superuser"),
    "bmc-not-a-url": lambda leaf: body(leaf, bmc_address="javascript:alert(1)"),
    "cpu-negative": lambda leaf: body(leaf, cpu_cores=-1),
    "cpu-string": lambda leaf: body(leaf, cpu_cores="many"),
    "ram-huge": lambda leaf: body(leaf, ram_gib=10**30),
    "nvme-negative": lambda leaf: body(leaf, nvme_tb="-1"),
    "gpu-model-unknown": lambda leaf: body(leaf, gpu_model="no-such-gpu"),
    "gpus-empty": lambda leaf: body(leaf, gpus=[]),
    "gpus-17": lambda leaf: body(leaf, gpus=[gpu(leaf, 0, index=i % 16) for i in range(17)]),
    "gpu-uuid-invalid": lambda leaf: body(leaf, gpus=[gpu(leaf, uuid="not-a-uuid")]),
    "gpu-pci-invalid": lambda leaf: body(leaf, gpus=[gpu(leaf, pci_bus_id="0000:zz:00.0")]),
    "gpu-index-twice": lambda leaf: body(leaf, gpus=[gpu(leaf, 0), gpu(leaf, 1, index=0)]),
    "gpu-unknown-field": lambda leaf: body(leaf, gpus=[gpu(leaf, state="available")]),
    "state-field": lambda leaf: body(leaf, state="available"),
    "gpus-not-a-list": lambda leaf: body(leaf, gpus={"index": 0}),
    "ib-ports-missing": lambda leaf: {k: v for k, v in body(leaf).items() if k != "ib_port_guids"},
    "ib-port-not-a-guid": lambda leaf: body(leaf, ib_port_guids=["0xnot-a-guid"]),
    "ib-port-too-long": lambda leaf: body(leaf, ib_port_guids=["0x" + "a" * 17]),
    "ib-port-twice": lambda leaf: body(leaf, ib_port_guids=["0xb83fd20300000001", "b83fd20300000001"]),
    "ib-port-addresses-fewer": lambda leaf: body(leaf, ib_port_pci_bus_ids=["00000000:1a:00.0"]),
    "ib-port-address-malformed": lambda leaf: body(leaf, ib_port_pci_bus_ids=["1a:00.0"] * 8),
    "ib-port-of-another-node": lambda leaf: body(leaf, ib_port_guids=[Node.objects.first().ib_ports.first().guid]),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_enrolment_is_a_400_that_writes_nothing(world, leaf, case):
    nodes, gpus = Node.objects.count(), GPU.objects.count()
    response = world.client("platform_admin").post(URL, BAD[case](leaf), format="json")
    assert response.status_code == 400, response.content[:300]
    assert response.json()["errors"][0]["code"]
    assert (Node.objects.count(), GPU.objects.count()) == (nodes, gpus)


def test_a_hostname_or_gpu_enrolled_twice_is_refused(world, leaf):
    client = world.client("platform_admin")
    first = body(leaf)
    assert client.post(URL, first, format="json").status_code == 201
    again = client.post(URL, body(leaf), format="json")
    assert again.status_code == 400 and again.json()["errors"][0]["attr"] == "hostname"
    stolen = client.post(URL, body(leaf, hostname="gpu-new-0002", gpus=first["gpus"]), format="json")
    assert stolen.status_code == 400 and stolen.json()["errors"][0]["attr"] == "gpus"


def test_two_enrolments_of_one_node_at_once_are_a_409_not_a_500(world, leaf):
    """The serializer's check can race; the database decides, and the loser gets a clean 409."""
    from cloud.models import GPUModel, Region
    from cloud.services import node_enrol
    from core.errors import Conflict

    fields = body(leaf)
    gpus = fields.pop("gpus")
    fields.update(region=Region.objects.get(slug="us-east-1"), fabric=leaf.fabric, leaf=leaf,
                  gpu_model=GPUModel.objects.get(slug=fields.pop("gpu_model")),
                  ib_port_guids=[guid.removeprefix("0x") for guid in fields["ib_port_guids"]])
    node_enrol(actor=None, gpus=gpus, **fields)
    nodes = Node.objects.count()
    with pytest.raises(Conflict) as raised:
        node_enrol(actor=None, gpus=gpus, **fields)
    assert raised.value.get_codes() == "already_enrolled" and Node.objects.count() == nodes
