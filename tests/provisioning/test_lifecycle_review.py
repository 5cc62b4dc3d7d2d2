"""
Holes found in review of the lifecycle, each kept closed: an attempt's cleaning touches only its
own instances, cleaning waits for a provisioning call still in flight, a disk written for someone
else is rewritten, evicted work is cleaned even after an earlier failure, a slot is not handed
over before its scrub, a failed VM's GPUs are held out until validation, and work whose window
ended before it started expires.
"""

from datetime import timedelta
from types import SimpleNamespace

import pytest
from django.utils import timezone

from cloud.models import GPU, Node
from provisioning.drivers.simulated import Simulated, SimulatedImage
from provisioning.lifecycle import runner
from provisioning.lifecycle import start as starting
from provisioning.lifecycle import steps as step_module
from provisioning.lifecycle import tick as ticking
from provisioning.lifecycle import validate as validating
from provisioning.lifecycle.steps import NodeFault, target_of
from provisioning.models import Instance, Operation, Reservation, StepRun
from provisioning.scheduling.scheduler import run_cycle
from tests.provisioning.factories import offering
from tests.provisioning.pipeline import SSH_KEY, reservation
from tests.world import small_fleet, vm_offering

URL = "/api/v1/reservations/"


@pytest.fixture
def fleet(world):
    Reservation.objects.all().delete()
    return small_fleet(8)


def create(world, chosen=None, **amount):
    chosen = chosen or offering("bare_metal", 8)
    amount = amount or {"nodes": 1}
    response = world.client("t1_member").post(URL, {"name": "job", "offering": chosen.slug, "regions": ["us-east-1"],
                                                    "duration_hours": 2, "ssh_public_key": SSH_KEY, **amount},
                                              format="json")
    assert response.status_code == 201, response.json()
    return response.json()["id"]


def fail_first_instance_at(monkeypatch, step_name, kind="bare_metal"):
    pipeline = step_module.PIPELINES[("provision", kind)]

    def broken(ctx):
        raise NodeFault(ctx.instances[0].node, f"{step_name} failed for good", transient=False)

    monkeypatch.setitem(step_module.PIPELINES, ("provision", kind),
                        [step_module.Step(s.name, broken if s.name == step_name else s.run) for s in pipeline])
    return pipeline


def test_an_attempts_cleaning_touches_only_its_own_instances(world, fleet, steps, monkeypatch):
    """Attempt 1 fails; its cleaning of the healthy node is held back while attempt 2 runs and is released."""
    pipeline = fail_first_instance_at(monkeypatch, "write_image")
    pk = create(world, nodes=2)
    steps.run()  # attempt 1 fails: node A faulty, node B's cleaning queued
    first_cleaning = Operation.objects.get(reservation_id=pk, kind="release")
    held_back = [task for task in steps.queue if task[1] == str(first_cleaning.pk)]
    steps.queue.clear()
    monkeypatch.setitem(step_module.PIPELINES, ("provision", "bare_metal"), pipeline)
    run_cycle()  # placed again, on other nodes
    steps.run()
    assert reservation(pk).state == "active"
    second = list(Instance.objects.filter(reservation_id=pk, state="active"))
    world.client("t1_member").post(f"{URL}{pk}/release/")
    steps.queue.extend(held_back)
    steps.run()
    assert reservation(pk).state == "released"
    for instance in second:
        assert Simulated.calls("disk", instance.node.hostname).get("wipe") == 1, instance.node.hostname
        assert Node.objects.get(pk=instance.node_id).state == "available"
    assert set(Instance.objects.filter(reservation_id=pk).values_list("state", flat=True)) <= {"released", "failed"}
    assert Instance.objects.get(released_by=first_cleaning).state == "released"


def test_cleaning_waits_for_a_provisioning_call_still_in_flight(world, fleet, steps):
    pk = create(world)
    what, reservation_id, _, _ = steps.queue.popleft()
    starting.reservation_provision_start(reservation_id)
    steps.queue.clear()
    provision = Operation.objects.get(reservation_id=pk, kind="provision")
    in_flight = StepRun.objects.create(operation=provision, name="write_image", attempt=1)  # its worker is busy
    world.client("t1_member").post(f"{URL}{pk}/cancel/")
    ran = steps.run(limit=5, settle=False)
    assert ran and all(outcome == "waiting" for _, _, outcome in ran)
    StepRun.objects.filter(pk=in_flight.pk).update(state="succeeded", finished_at=timezone.now())
    steps.run()
    assert reservation(pk).state == "released"


def test_a_disk_written_for_someone_else_is_written_again(world, fleet, steps):
    node = Node.objects.filter(pool="bare_metal", is_spare=False).order_by("hostname").first()
    SimulatedImage().write_image(target_of(node), "ubuntu-24.04-cuda-12.8", "ssh-ed25519 AAAA previous", "someone")
    Node.objects.filter(pool="bare_metal").exclude(pk=node.pk).update(state="maintenance")
    pk = create(world)
    steps.run()
    instance = Instance.objects.get(reservation_id=pk)
    assert instance.node_id == node.pk
    assert SimulatedImage().deployed_for(target_of(node)) == str(instance.pk)
    assert Simulated.calls("disk", node.hostname)["write_image"] == 2


def test_evicted_work_is_cleaned_even_after_an_earlier_failed_attempt(world, fleet, steps, monkeypatch):
    pipeline = fail_first_instance_at(monkeypatch, "write_image")
    pk = create(world)
    steps.run()
    monkeypatch.setitem(step_module.PIPELINES, ("provision", "bare_metal"), pipeline)
    run_cycle()
    steps.run()
    assert reservation(pk).state == "active"
    node = Instance.objects.get(reservation_id=pk, state="active").node
    Reservation.objects.filter(pk=pk).update(state="releasing", released_at=timezone.now())  # evicted, hard
    assert ticking.tick()["releases"] == 1
    steps.run()
    assert reservation(pk).state == "released"
    assert Node.objects.get(pk=node.pk).state == "available"


def test_a_slot_is_not_handed_over_before_its_previous_tenant_is_scrubbed(world, fleet, steps):
    chosen = offering("container", 1, slots_per_gpu=8)
    first = create(world, chosen, slots=1)
    steps.run()
    held = Instance.objects.get(reservation_id=first)
    world.client("t1_member").post(f"{URL}{first}/release/")
    steps.queue.clear()  # its cleaning has not run yet
    Reservation.objects.filter(pk=first).update(state="releasing")
    assert Instance.objects.get(pk=held.pk).state == "releasing"
    device = held.devices[0]
    same = SimpleNamespace(gpu_id=device["gpu_id"], node_id=held.node_id, mem_lo=device["mem_lo"],
                           mem_hi=device["mem_hi"])
    beside = SimpleNamespace(gpu_id=device["gpu_id"], node_id=held.node_id, mem_lo=device["mem_hi"],
                             mem_hi=device["mem_hi"] + (device["mem_hi"] - device["mem_lo"]))
    assert starting._previous_tenant_still_there([same])  # the next tenant waits for the scrub
    assert not starting._previous_tenant_still_there([beside])  # the slot next to it is free


def test_a_failed_vm_keeps_its_gpus_out_until_the_node_is_validated(world, fleet, steps, monkeypatch):
    fail_first_instance_at(monkeypatch, "start_domain", kind="vm")
    pk = create(world, vm_offering(1), gpus=1)
    steps.run()
    instance = Instance.objects.get(reservation_id=pk)
    gpu = GPU.objects.get(pk=instance.devices[0]["gpu_id"])
    assert gpu.state == "quarantined" and Node.objects.get(pk=instance.node_id).state == "faulty"
    Node.objects.filter(pk=instance.node_id).update(state="repair")
    validating.node_validate(actor=None, node=Node.objects.get(pk=instance.node_id))
    steps.run()
    assert Node.objects.get(pk=instance.node_id).state == "in_service"
    assert GPU.objects.get(pk=gpu.pk).state == "available"


def test_work_whose_window_ended_before_it_started_expires(world, fleet, steps):
    pk = create(world)
    steps.queue.clear()  # nobody started it
    Reservation.objects.filter(pk=pk).update(starts_at=timezone.now() - timedelta(hours=3),
                                             ends_at=timezone.now() - timedelta(hours=1))
    assert ticking.tick()["expired"] == 1
    assert reservation(pk).state == "expired"


def test_a_step_locks_the_reservation_before_its_operation_as_services_do(world, fleet, steps):
    """
    Cancel takes reservation then operation; the step that ends an operation (and moves its
    reservation) takes them in the same order (no deadlock). The steps before it lock only the
    operation: holding no reservation and asking for none, they close no cycle either.
    """
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    def locked(queries):
        tables = [q["sql"].split(" FROM ")[1].split()[0].strip('"') for q in queries.captured_queries
                  if " FOR UPDATE" in q["sql"]]
        return [t for t in tables if t in ("provisioning_reservation", "provisioning_operation")]

    pk = create(world)
    what, reservation_id, _, _ = steps.queue.popleft()
    starting.reservation_provision_start(reservation_id)
    seen = []
    while steps.queue:
        _, operation_id, step, token = steps.queue.popleft()
        with CaptureQueriesContext(connection) as queries:
            runner.operation_run_step(operation_id, step, token)
        seen.append((step, locked(queries)))
        if len(seen) == 1:
            assert reservation(pk).state == "provisioning"
    assert reservation(pk).state == "active"
    *before, (last, at_end) = seen
    assert last == "hand_over" and at_end == ["provisioning_reservation", "provisioning_operation"], seen
    assert before and all(tables == ["provisioning_operation"] for _, tables in before), seen

