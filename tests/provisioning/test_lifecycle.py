"""
Provisioning and release of each offering kind with simulated drivers: a scheduled reservation
becomes active with reachable instances, and a released one comes back clean.
"""

import pytest
from django.db import connection

from cloud.models import GPU, Node
from provisioning.drivers.simulated import Simulated
from provisioning.lifecycle import runner
from provisioning.lifecycle import start as starting
from provisioning.lifecycle import tick as ticking
from provisioning.models import Instance, Operation, StepRun
from tests.provisioning.factories import offering
from tests.provisioning.pipeline import SSH_KEY, reservation
from tests.world import small_fleet

URL = "/api/v1/reservations/"


@pytest.fixture
def fleet(world):
    from provisioning.models import Reservation

    Reservation.objects.all().delete()  # the world's own queued work would compete
    return small_fleet(4)


def create(world, chosen, **amount):
    client = world.client("t1_member")
    response = client.post(URL, {"name": "job", "offering": chosen.slug, "regions": ["us-east-1"],
                                 "duration_hours": 2, "ssh_public_key": SSH_KEY, **amount}, format="json")
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["state"] == "scheduled", body
    return body["id"]


def release(world, pk):
    response = world.client("t1_member").post(f"{URL}{pk}/release/")
    assert response.status_code in (200, 202), response.json()


def test_bare_metal_is_deployed_handed_over_and_cleaned(world, fleet, steps):
    pk = create(world, offering("bare_metal", 8), nodes=1)
    steps.run()
    active = reservation(pk)
    assert active.state == "active"
    instance = Instance.objects.get(reservation=active)
    node = instance.node
    assert instance.state == "active" and instance.address.startswith(node.hostname) and instance.ssh_user
    assert Node.objects.get(pk=node.pk).state == "allocated"
    assert [s for _, s, _ in steps.ran] == ["power_on_deploy", "write_image", "boot_from_disk", "join_network",
                                            "verify", "hand_over"]
    operation = Operation.objects.get(reservation=active, kind="provision")
    assert (operation.state, operation.progress) == ("succeeded", 100)
    assert Simulated.calls("disk", node.hostname) == {"write_image": 1}

    release(world, pk)
    steps.run()
    released = reservation(pk)
    assert released.state == "released"
    assert Node.objects.get(pk=node.pk).state == "available"
    assert Instance.objects.get(pk=instance.pk).state == "released"
    assert Simulated.calls("disk", node.hostname)["wipe"] == 1
    assert Simulated.calls("host", node.hostname)["scrub"] == 1
    cleaning = Operation.objects.get(reservation=released, kind="release")
    assert cleaning.state == "succeeded"
    assert list(StepRun.objects.filter(operation=cleaning).values_list("name", flat=True)) == [
        "power_off", "wipe", "leave_network", "scrub", "verify", "reset_power"]


def test_a_vm_gets_its_gpus_passed_through_and_gives_them_back(world, fleet, steps):
    from tests.world import vm_offering

    pk = create(world, vm_offering(2), gpus=2)
    steps.run()
    assert reservation(pk).state == "active"
    instance = Instance.objects.get(reservation_id=pk)
    gpu_ids = [d["gpu_id"] for d in instance.devices]
    assert len(gpu_ids) == 2 and set(GPU.objects.filter(pk__in=gpu_ids).values_list("state", flat=True)) == {
        "allocated"}
    domain = Simulated.calls("hypervisor", instance.node.hostname)
    assert domain == {"create_volume": 1, "define": 1, "start": 1}
    assert Node.objects.get(pk=instance.node_id).state == "in_service"  # a shared host stays in service

    release(world, pk)
    steps.run()
    assert reservation(pk).state == "released"
    assert set(GPU.objects.filter(pk__in=gpu_ids).values_list("state", flat=True)) == {"available"}
    assert Simulated.calls("hypervisor", instance.node.hostname) == {
        "create_volume": 1, "define": 1, "start": 1, "stop": 1, "undefine": 1, "delete_volume": 1}


def test_a_container_slot_carries_its_memory_cap(world, fleet, steps):
    from provisioning.drivers.simulated import SimulatedContainers
    from provisioning.lifecycle.steps import target_of

    chosen = offering("container", 1, slots_per_gpu=8)
    pk = create(world, chosen, slots=1)
    steps.run()
    assert reservation(pk).state == "active"
    instance = Instance.objects.get(reservation_id=pk)
    namespace = f"tenant-{instance.reservation.tenant_id}"
    pod = SimulatedContainers().pod(target_of(instance.node), namespace, instance.name)
    limits = pod["spec"]["containers"][0]["resources"]["limits"]
    # 1/64 of the host (8 GPUs, 8 slots each): of its 112 cores, and 90% of its 2 TiB.
    assert limits == {"nvidia.com/gpu.shared": "1", "cpu": "1750m", "memory": "29491Mi"}
    device = instance.devices[0]
    cap = pod["metadata"]["annotations"]["meridian.cloud/gpu-memory-cap-mib"]
    assert cap == str(device["mem_hi"] - device["mem_lo"])
    assert pod["spec"]["nodeName"] == instance.node.hostname
    assert GPU.objects.get(pk=device["gpu_id"]).state == "available"  # a slot does not take the whole GPU

    release(world, pk)
    steps.run()
    assert reservation(pk).state == "released"
    assert SimulatedContainers().pod(target_of(instance.node), namespace, instance.name) is None
    assert SimulatedContainers().secret(target_of(instance.node), namespace, instance.name) is None


#
# Steps chained in one task, and dispatch tokens
#


def test_a_chain_runs_an_operations_steps_in_one_task_and_records_each(world, fleet, steps, settings):
    settings.MERIDIAN_STEP_CHAIN_SECONDS = 5
    pk = create(world, offering("bare_metal", 8), nodes=1)
    steps.run()
    assert reservation(pk).state == "active"
    assert steps.ran == [("provision", "power_on_deploy", "done")]  # one task took it to active
    operation = Operation.objects.get(reservation_id=pk, kind="provision")
    assert (operation.state, operation.progress) == ("succeeded", 100)
    runs = StepRun.objects.filter(operation=operation).order_by("pk").values_list("name", "attempt", "state")
    assert list(runs) == [(name, 1, "succeeded") for name in ("power_on_deploy", "write_image", "boot_from_disk",
                                                              "join_network", "verify", "hand_over")]


def test_a_chain_hands_the_rest_to_a_new_task_when_its_time_is_up(world, fleet, steps, settings, monkeypatch):
    from provisioning.lifecycle import runner

    settings.MERIDIAN_STEP_CHAIN_SECONDS = 2.5
    clock = iter(range(1000))
    monkeypatch.setattr(runner.time, "monotonic", lambda: next(clock))  # a second per look at the clock
    pk = create(world, offering("bare_metal", 8), nodes=1)
    steps.run()
    assert reservation(pk).state == "active"
    # A task looks at the clock once to start and once before each step: its first two steps go on
    # to the next, the third (past 2.5 "seconds") sends the next step out as a new task.
    assert [step for kind, step, _ in steps.ran if kind == "provision"] == ["power_on_deploy", "join_network"]
    runs = StepRun.objects.filter(operation__reservation_id=pk).values_list("name", flat=True)
    assert len(runs) == len(set(runs)) == 6  # every step once


def test_a_chain_hands_on_as_a_new_task_when_a_newer_message_took_the_operation(
    world, fleet, steps, settings, monkeypatch
):
    """
    The reaper resumes an operation while its chain is inside a step (it looked stuck): the chain
    closes that step and sends the next out as a new task, as an unchained step does; the reaper's
    message, older now, is skipped. Every step runs once, and a message always carries the
    operation (the reaper's copy may be running the same step at once, and stops when it finds
    the operation moved on).
    """
    from provisioning.lifecycle.steps import PIPELINES, Step

    settings.MERIDIAN_STEP_CHAIN_SECONDS = 5
    pipeline = PIPELINES[("provision", "bare_metal")]
    original = pipeline[1]

    def write_image_then_resumed(ctx):
        original.run(ctx)
        ticking._resume(ctx.operation)  # a new dispatch token, the step sent again

    monkeypatch.setitem(PIPELINES, ("provision", "bare_metal"),
                        [pipeline[0], Step(original.name, write_image_then_resumed), *pipeline[2:]])
    pk = create(world, offering("bare_metal", 8), nodes=1)
    steps.run()
    assert reservation(pk).state == "active"
    assert [(step, outcome) for _, step, outcome in steps.ran] == [
        ("power_on_deploy", "done"),  # the chain: power_on_deploy, then write_image, then a new task
        ("write_image", "skipped"),  # the reaper's message
        ("boot_from_disk", "done"),  # the new task: on to the end
    ]
    runs = StepRun.objects.filter(operation__reservation_id=pk).order_by("pk").values_list("name", "state")
    assert list(runs) == [(step.name, "succeeded") for step in pipeline]


def test_a_chained_step_leaves_out_an_instance_failed_meanwhile(world, fleet, steps, settings, monkeypatch):
    """
    While a chain runs, one of the reservation's instances fails (its GPU lost: replacement marks
    it failed and cleans up after it). The steps after leave it alone: no domain started, no port
    joined for it -- as when each step read the operation's instances again.
    """
    from provisioning.lifecycle.steps import PIPELINES, Step
    from provisioning.networks.ports import instance_ports, ports_abandon

    settings.MERIDIAN_STEP_CHAIN_SECONDS = 5
    pipeline = PIPELINES[("provision", "vm")]
    lost = []

    def define_then_one_lost(ctx):
        pipeline[0].run(ctx)
        lost.append(ctx.instances[1])
        Instance.objects.filter(pk=ctx.instances[1].pk).update(state="failed")
        ports_abandon([ctx.instances[1]])  # as replacement does: its virtual function (handed out at define) freed

    monkeypatch.setitem(PIPELINES, ("provision", "vm"), [Step(pipeline[0].name, define_then_one_lost), *pipeline[1:]])
    pk = create(world, offering("vm", 1), gpus=2)
    steps.run()
    assert reservation(pk).state == "active"
    [gone] = lost
    kept = Instance.objects.get(reservation_id=pk, state="active")
    calls = Simulated.calls("hypervisor", gone.node.hostname)
    assert calls["define"] == 2 and calls["start"] == 1  # only the instance still provisioning was started
    assert instance_ports(gone, assign=False) == [] and instance_ports(kept, assign=False)


@pytest.mark.skipif(connection.vendor != "postgresql", reason="statement counts as PostgreSQL runs them")
def test_a_chained_step_reads_nothing_again(world, fleet, steps, settings, monkeypatch):
    """
    A step run in the chain of the one before it uses what that one loaded: closing a step and
    opening the next is one transaction of five statements (the operation's lock, the two step
    rows, which instances are still the operation's, the operation) around the step's own work;
    closing the last locks the reservation first (it moves it).
    """
    from django.test.utils import CaptureQueriesContext

    from provisioning.lifecycle.steps import PIPELINES, Step

    settings.MERIDIAN_STEP_CHAIN_SECONDS = 5
    noop = [Step(step.name, lambda ctx: None) for step in PIPELINES[("provision", "vm")]]
    monkeypatch.setitem(PIPELINES, ("provision", "vm"), noop)
    create(world, offering("vm", 1), gpus=1)
    _, reservation_id, _, _ = steps.queue.popleft()
    starting.reservation_provision_start(reservation_id)
    _, operation_id, first, token = steps.queue.popleft()
    with CaptureQueriesContext(connection) as queries:
        runner.operation_run_step(operation_id, first, token)
    statements = [q["sql"] for q in queries if not q["sql"].startswith(("SAVEPOINT", "RELEASE SAVEPOINT"))]
    loads = [q for q in statements if q.startswith('SELECT "provisioning_operation"') and "FOR UPDATE" not in q]
    assert len(loads) == 1  # the operation with its reservation, offering, region, VPC: read once for the chain
    first_lock = next(i for i, q in enumerate(statements) if "FOR UPDATE" in q)
    last_close = max(i for i, q in enumerate(statements) if q.startswith('UPDATE "provisioning_steprun"'))
    # Between the first step's end and the last's: five statements per step that follows, three to close the last.
    assert last_close - first_lock + 1 == 5 * (len(noop) - 1) + 3, "\n".join(q[:100] for q in statements)
    assert Operation.objects.get(pk=operation_id).state == "succeeded"


def test_a_message_older_than_the_operations_last_dispatch_is_skipped(world, fleet, steps):

    create(world, offering("bare_metal", 8), nodes=1)
    what, reservation_id, _, _ = steps.queue.popleft()
    starting.reservation_provision_start(reservation_id)
    _, operation_id, first, old_token = steps.queue.popleft()
    assert runner.operation_run_step(operation_id, first, old_token) == "done"
    # The next step went out under a new token: the first message, delivered again, does nothing.
    runs = StepRun.objects.count()
    assert runner.operation_run_step(operation_id, first, old_token) == "skipped"
    assert runner.operation_run_step(operation_id, "write_image", old_token) == "skipped"
    assert StepRun.objects.count() == runs
    steps.run()
    assert Operation.objects.get(pk=operation_id).state == "succeeded"
