"""
Time-sliced GPUs end to end on the simulated fleet: tasks of one class pack onto a GPU and never
share it with another class (the planner, and the database's constraint under it); each task is
held to 90 % of its slot by the watchdog; the agent puts the GPU on its class's slice, reports what
is in force, and reports a GPU it could not set. Offerings refuse shapes that cannot be sold.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from cloud.models import GPU, GPUTelemetry, Offering
from operations.node_api import agents as node_agents
from provisioning.agent.agent import Agent
from provisioning.agent.nvml import SimulatedGPU, SimulatedNVML
from provisioning.allocations import CapacityTaken, allocation_bind
from provisioning.models import Allocation, Instance
from provisioning.scheduling.plan_types import Assignment
from security.models import Incident
from tests.provisioning.factories import make_reservation, offering
from tests.provisioning.pipeline import SSH_KEY
from tests.security.test_isolation import InProcess, agent_for
from tests.world import h100, small_fleet


@pytest.fixture
def fleet(world):
    return small_fleet(4)


def sliced(klass: str = "realtime", n: int = 4) -> Offering:
    return offering("container", 1, slots_per_gpu=n, isolation_mode="time_sliced", time_slice_class=klass,
                    slug=f"ct-ts-{klass}-{n}")


def reserve(world, chosen: Offering, persona: str = "t1_member") -> Instance:
    response = world.client(persona).post("/api/v1/reservations/", {
        "name": "infer", "offering": chosen.slug, "slots": 1, "regions": ["us-east-1"], "duration_hours": 1,
        "ssh_public_key": SSH_KEY}, format="json")
    assert response.status_code == 201, response.json()
    return response.json()["id"]


def test_one_class_packs_onto_a_gpu_and_another_class_gets_its_own(world, fleet, steps):
    realtime, batch = sliced("realtime"), sliced("batch")
    made = [reserve(world, realtime, "t1_member"), reserve(world, realtime, "t2_member"), reserve(world, batch)]
    steps.run()
    a, b, c = (Instance.objects.get(reservation_id=pk, state="active") for pk in made)
    assert a.devices[0]["gpu_id"] == b.devices[0]["gpu_id"] != c.devices[0]["gpu_id"]
    classes = dict(Allocation.objects.filter(reservation_id__in=made).values_list("reservation_id", "share_class"))
    assert sorted(classes.values()) == ["batch", "realtime", "realtime"]
    policy = node_agents.node_policy(node=a.node)[a.devices[0]["index"]]
    slot = a.devices[0]["mem_hi"] - a.devices[0]["mem_lo"]
    assert policy["time_slice_ms"] == 1 and policy["mode"] == "shared"
    assert policy["owners"] == {a.name: int(slot * 0.9), b.name: int(slot * 0.9)}


def test_the_agent_sets_the_class_slice_reports_it_and_holds_each_task_to_its_cap(world, fleet, steps):
    pk = reserve(world, sliced("batch"))
    steps.run()
    instance = Instance.objects.get(reservation_id=pk, state="active")
    index = instance.devices[0]["index"]
    agent = agent_for(instance.node)
    gpu = agent.nvml.gpus[index]
    cap = int((instance.devices[0]["mem_hi"] - instance.devices[0]["mem_lo"]) * 0.9)
    gpu.processes = [{"pid": 7, "used_memory_mib": cap + 100, "owner": instance.name}]  # within the slot, over the cap
    agent.run_once()
    assert gpu.time_slice_ms == 5  # batch: 5 ms slices
    assert [s["time_slice_ms"] for s in agent.samples(agent.inventory()) if s["uuid"] == gpu.uuid] == [5]
    gpus = agent.inventory()  # the heartbeat's samples stored, and shown to staff
    node_agents.heartbeat(node=instance.node, agent_version="1", gpus=gpus, samples=agent.samples(gpus))
    assert GPUTelemetry.objects.get(gpu_id=instance.devices[0]["gpu_id"]).time_slice_ms == 5
    shown = world.client("platform_admin").get(f"/api/v1/gpus/{instance.devices[0]['gpu_id']}/telemetry/").json()
    assert shown["latest"]["time_slice_ms"] == 5
    assert gpu.processes == []  # over its cap: stopped
    assert Incident.objects.get(kind="isolation_over_cap").evidence["owner"] == instance.name
    assert not Incident.objects.filter(kind="isolation_wrong_time_slice").exists()


def test_a_gpu_that_cannot_be_put_on_its_slice_is_reported_not_quarantined(world, fleet, steps):
    pk = reserve(world, sliced("training", 2))
    steps.run()
    instance = Instance.objects.get(reservation_id=pk, state="active")
    nvml = SimulatedNVML([SimulatedGPU(index=g.index, uuid=g.uuid, memory_mib=g.memory_mib)
                          for g in instance.node.gpus.order_by("index")])
    agent = Agent(InProcess(instance.node), nvml, time_slice_command=["false"])  # the host's command fails
    agent.run_once()
    incident = Incident.objects.get(kind="isolation_wrong_time_slice")
    assert "not the 50 ms" in incident.summary and incident.evidence["action"] == "report"
    assert GPU.objects.get(pk=instance.devices[0]["gpu_id"]).state != "quarantined"


def test_the_database_refuses_two_classes_on_one_gpu_at_once(world, fleet):
    gpu = GPU.objects.filter(node__pool="shared", node__is_spare=False).first()
    now = timezone.now()
    quarter = gpu.memory_mib // 4

    def bind(klass: str, k: int):
        with transaction.atomic():
            allocation_bind(reservation=make_reservation(world), starts_at=now, ends_at=now + timedelta(hours=1),
                            assignments=[Assignment(gpu.node_id, gpu.pk, k * quarter, (k + 1) * quarter, klass)])

    bind("realtime", 0)
    bind("realtime", 1)  # the same class beside it
    with pytest.raises(CapacityTaken):
        bind("training", 2)  # free memory, but another class
    assert Allocation.objects.filter(gpu=gpu).count() == 2


@pytest.mark.parametrize("shape, field", [
    ({"slots_per_gpu": 9, "time_slice_class": "batch"}, "slots_per_gpu"),  # more than 8 tasks a GPU
    ({"slots_per_gpu": 4, "time_slice_class": ""}, "time_slice_class"),
    ({"slots_per_gpu": 4, "time_slice_class": "batch", "kind": "vm"}, "isolation_mode"),
])
def test_offerings_that_cannot_be_time_sliced_are_refused(world, shape, field):
    fields = {"slug": "ts-bad", "name": "bad", "kind": "container", "gpu_model": h100(),
              "gpus_per_unit": 1, "isolation_mode": "time_sliced", "price_per_gpu_hour": "1.00", **shape}
    with pytest.raises(ValidationError) as refused:
        Offering(**fields).full_clean()
    assert field in refused.value.message_dict


def test_a_slice_class_without_time_slicing_is_refused(world):
    chosen = Offering(slug="x", name="x", kind="container", gpu_model=h100(), gpus_per_unit=1,
                      slots_per_gpu=4, isolation_mode="shared", time_slice_class="batch", price_per_gpu_hour="1.00")
    with pytest.raises(ValidationError) as refused:
        chosen.full_clean()
    assert "time_slice_class" in refused.value.message_dict
