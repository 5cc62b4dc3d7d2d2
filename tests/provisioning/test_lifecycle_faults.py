"""
Faults in the provisioning pipeline: a worker lost between a driver call and its commit, driver
errors that pass and ones that do not, cleaning that fails, validation, and the tick that starts,
expires and resumes work. Nothing is provisioned twice, nothing leaks, nothing is stuck.
"""

from datetime import timedelta

import pytest
import time_machine
from django.utils import timezone

from cloud.models import Node
from provisioning.drivers.simulated import Simulated, SimulatedHost
from provisioning.lifecycle import runner
from provisioning.lifecycle import start as starting
from provisioning.lifecycle import tick as ticking
from provisioning.lifecycle import validate as validating
from provisioning.lifecycle.steps import target_of
from provisioning.models import AddressAssignment, Allocation, Instance, Operation, Reservation, StepRun
from security.models import Incident
from tests.provisioning.factories import offering
from tests.provisioning.pipeline import SSH_KEY, reservation
from tests.world import small_fleet

URL = "/api/v1/reservations/"


class WorkerLost(Exception):
    """The worker died: its message is delivered again (late acknowledgement)."""


@pytest.fixture
def fleet(world):
    Reservation.objects.all().delete()
    return small_fleet(4)


@pytest.fixture
def simulation(settings):
    def set_faults(**knobs):
        settings.MERIDIAN_SIMULATION = {"seed": 0, "latency_s": {}, "failure_rate": {}, "broken_rate": {}, **knobs}
    return set_faults


def create(world, nodes=1, **extra):
    response = world.client("t1_member").post(URL, {
        "name": "job", "offering": offering("bare_metal", 8).slug, "regions": ["us-east-1"], "duration_hours": 2,
        "ssh_public_key": SSH_KEY, "nodes": nodes, **extra}, format="json")
    assert response.status_code == 201, response.json()
    return response.json()["id"]


def bare_metal_nodes():
    return list(Node.objects.filter(pool="bare_metal", is_spare=False).order_by("hostname"))


def without_attest(calls: dict) -> dict:
    """Attestation is a read (fresh evidence for a fresh challenge): a redone verify rightly asks again."""
    return {action: count for action, count in calls.items() if action != "attest"}


@pytest.mark.parametrize("chain_s", [0, 5], ids=["task_per_step", "chained_steps"])
def test_a_step_redone_after_a_lost_worker_does_not_repeat_its_side_effects(world, fleet, steps, monkeypatch,
                                                                             settings, chain_s):
    """
    Every step dies once after its driver calls, before its commit; the redelivery finds the work
    done. Chained, the message redelivered is the one that began the chain: it goes on from the
    step that died, not from the step it named.
    """
    settings.MERIDIAN_STEP_CHAIN_SECONDS = chain_s
    real = runner._steps_succeeded
    crashed = set()

    def crash_once_before_commit(succeeded, **kwargs):
        (context, run), = succeeded
        if (context.operation.kind, run.name) not in crashed:
            crashed.add((context.operation.kind, run.name))
            raise WorkerLost
        return real(succeeded, **kwargs)

    monkeypatch.setattr(runner, "_steps_succeeded", crash_once_before_commit)
    pk = create(world)
    steps.run(redeliver=WorkerLost)
    assert reservation(pk).state == "active"
    node = Instance.objects.get(reservation_id=pk).node
    # The deploy image, then the config drive: each inserted once; on, off and on into the OS, once each.
    assert Simulated.calls("bmc", node.hostname) == {"insert_media": 2, "set_boot_device": 2, "set_power": 3,
                                                     "eject_media": 1}
    assert Simulated.calls("disk", node.hostname) == {"write_image": 1}
    assert without_attest(Simulated.calls("host", node.hostname)) == {"use": 1}

    world.client("t1_member").post(f"{URL}{pk}/release/")
    steps.run(redeliver=WorkerLost)
    assert reservation(pk).state == "released"
    assert Simulated.calls("disk", node.hostname) == {"write_image": 1, "wipe": 1}
    assert without_attest(Simulated.calls("host", node.hostname)) == {"use": 1, "scrub": 1}
    assert Simulated.calls("bmc", node.hostname)["set_power"] == 4  # and off at release: once
    assert Node.objects.get(pk=node.pk).state == "available"
    assert len(crashed) == 12  # six provisioning and six cleaning steps each died once


def test_a_redelivered_step_that_already_committed_does_nothing(world, fleet, steps):
    pk = create(world)
    steps.run()
    operation = Operation.objects.get(reservation_id=pk, kind="provision")
    runs = StepRun.objects.count()
    for step in ("power_on_deploy", "write_image", "hand_over"):
        assert runner.operation_run_step(operation.pk, step) == "skipped"
    assert StepRun.objects.count() == runs


def test_transient_errors_retry_with_growing_backoff_then_succeed(world, fleet, steps, simulation, monkeypatch):
    simulation(failure_rate={"write_image": 1.0})
    pk = create(world)
    real = runner.operation_run_step

    def heal_after_two_failures(operation_id, step, dispatch=None):
        if StepRun.objects.filter(name="write_image", state="failed").count() >= 2:
            simulation()
        return real(operation_id, step, dispatch)

    monkeypatch.setattr(runner, "operation_run_step", heal_after_two_failures)
    steps.run()
    assert reservation(pk).state == "active"
    attempts = list(StepRun.objects.filter(name="write_image").values_list("attempt", "state", "error"))
    assert [(a, s) for a, s, _ in attempts] == [(1, "failed"), (2, "failed"), (3, "succeeded")]
    assert all("timed out" in error for _, state, error in attempts if state == "failed")
    assert steps.countdowns == [2.0, 4.0]


def test_a_step_that_keeps_failing_marks_the_node_faulty_and_requeues_the_reservation(
        world, fleet, steps, simulation):
    """Two nodes: the first never takes its image. It goes faulty; the other is cleaned and given back."""
    simulation(failure_rate={"write_image": 1.0})
    pk = create(world, nodes=2)
    submitted = reservation(pk).submitted_at
    steps.run()
    first, second = [i.node for i in Instance.objects.filter(reservation_id=pk).order_by("index")]
    requeued = reservation(pk)
    assert requeued.state == "queued" and requeued.submitted_at == submitted  # keeps its place
    assert "placing the reservation again" in requeued.state_reason and requeued.provision_failures == 1
    assert not Allocation.objects.filter(reservation_id=pk, ends_at__gt=timezone.now()).exists()  # none held on
    failed = Node.objects.get(pk=first.pk)
    assert failed.state == "faulty" and "Provisioning failed" in failed.state_reason
    assert Node.objects.get(pk=second.pk).state == "available"  # cleaned: powered off, ready
    assert Simulated.calls("bmc", second.hostname)["set_power"] == 2
    assert StepRun.objects.filter(name="write_image").count() == 5  # MERIDIAN_STEP_ATTEMPTS
    provision = Operation.objects.get(reservation_id=pk, kind="provision")
    assert provision.state == "failed" and "write_image (attempt 5 of 5)" in provision.error
    assert set(Instance.objects.filter(reservation_id=pk).values_list("node_id", "state")) == {
        (first.pk, "failed"), (second.pk, "released")}


def test_after_the_configured_failures_the_reservation_fails_with_the_reason(world, fleet, steps, simulation,
                                                                              settings):
    settings.MERIDIAN_PROVISION_FAILURES = 1
    simulation(broken_rate={"insert_media": 1.0})
    pk = create(world)
    steps.run()
    failed = reservation(pk)
    assert failed.state == "failed" and "Simulated hardware fault" in failed.state_reason
    assert StepRun.objects.get(name="power_on_deploy").state == "gave_up"  # for good: no retry
    assert not Allocation.objects.filter(reservation_id=pk, ends_at__gt=timezone.now()).exists()  # none held on


def test_cleaning_that_fails_never_returns_the_node_to_the_pool(world, fleet, steps, simulation):
    pk = create(world)
    steps.run()
    node = Instance.objects.get(reservation_id=pk).node
    simulation(failure_rate={"wipe": 1.0})
    world.client("t1_member").post(f"{URL}{pk}/release/")
    steps.run()
    assert reservation(pk).state == "released"  # the tenant's part is done
    faulty = Node.objects.get(pk=node.pk)
    assert faulty.state == "faulty" and "Cleaning failed" in faulty.state_reason
    wipes = list(StepRun.objects.filter(name="wipe").values_list("state", "error"))
    assert [state for state, _ in wipes] == ["failed", "failed", "gave_up"]  # MERIDIAN_CLEANING_ATTEMPTS
    assert all(error for _, error in wipes)  # the cause, every time
    cleaning = Operation.objects.get(reservation_id=pk, kind="release")
    assert cleaning.state == "failed" and "wipe" in cleaning.error


def test_an_unscrubbable_gpu_of_a_vm_is_quarantined(world, fleet, steps, simulation):
    from cloud.models import GPU
    from tests.world import vm_offering

    response = world.client("t1_member").post(URL, {"name": "vm", "offering": vm_offering(1).slug, "gpus": 1,
                                                    "regions": ["us-east-1"], "duration_hours": 1}, format="json")
    pk = response.json()["id"]
    steps.run()
    instance = Instance.objects.get(reservation_id=pk)
    simulation(broken_rate={"scrub": 1.0})
    world.client("t1_member").post(f"{URL}{pk}/release/")
    steps.run()
    assert GPU.objects.get(pk=instance.devices[0]["gpu_id"]).state == "quarantined"
    assert reservation(pk).state == "released"
    # Only that GPU is held: the host and its other tenants go on.
    assert Node.objects.get(pk=instance.node_id).state == "in_service"
    assert Incident.objects.filter(kind="scrub_unverified", node_id=instance.node_id).exists()


def test_a_server_whose_scrub_cannot_be_verified_is_quarantined_not_resold(world, fleet, steps, simulation):
    pk = create(world)
    steps.run()
    node = Instance.objects.get(reservation_id=pk).node
    simulation(broken_rate={"scrub": 1.0})
    world.client("t1_member").post(f"{URL}{pk}/release/")
    steps.run()
    held = Node.objects.get(pk=node.pk)
    assert held.state == "quarantined" and "Scrub not verified" in held.state_reason
    assert Incident.objects.get(kind="scrub_unverified", node_id=node.pk).evidence["whole_node"] is True


def test_validation_sells_a_healthy_node_and_holds_one_missing_a_gpu(world, fleet, steps):
    healthy, broken = bare_metal_nodes()[:2]
    Node.objects.filter(pk__in=[healthy.pk, broken.pk]).update(state="maintenance")
    gone = broken.gpus.order_by("index").last()
    SimulatedHost()._act(target_of(broken), "break", lambda s: s.update(missing=[gone.index]))
    for node in (healthy, broken):
        validating.node_validate(actor=None, node=Node.objects.get(pk=node.pk))
    steps.run()
    assert Node.objects.get(pk=healthy.pk).state == "available"
    held = Node.objects.get(pk=broken.pk)
    assert held.state == "faulty" and gone.uuid in held.state_reason
    assert Operation.objects.get(node=broken, kind="validate").state == "failed"


def test_the_tick_starts_due_work_expires_ended_work_and_validates_waiting_nodes(world, fleet, steps):
    later = timezone.now() + timedelta(hours=1)
    pk = create(world, start=later.isoformat())
    assert reservation(pk).state in ("scheduled", "queued")
    from provisioning.scheduling.scheduler import run_cycle

    run_cycle()
    assert reservation(pk).state == "scheduled"
    assert ticking.tick()["started"] == 0  # not due yet
    with time_machine.travel(later + timedelta(seconds=1), tick=True):
        assert ticking.tick()["started"] == 1
        steps.run()
        assert reservation(pk).state == "active"
    with time_machine.travel(later + timedelta(hours=2, seconds=1), tick=True):
        assert ticking.tick()["expired"] == 1
        steps.run()
        assert reservation(pk).state == "released"
    node = Node.objects.filter(pool="bare_metal", is_spare=False, state="available").first()
    Node.objects.filter(pk=node.pk).update(state="validating")
    assert ticking.tick()["validations"] == 1
    steps.run()
    assert Node.objects.get(pk=node.pk).state == "available"


def start_then_lose_the_first_step(steps):
    """Provisioning starts; the worker that took its first step dies and no redelivery comes."""
    what, reservation_id, _, _ = steps.queue.popleft()
    assert what == "start"
    starting.reservation_provision_start(reservation_id)
    steps.queue.clear()


def test_the_reaper_resumes_stuck_work_then_fails_it_cleanly(world, fleet, steps, settings):
    pk = create(world)
    start_then_lose_the_first_step(steps)
    operation = Operation.objects.get(reservation_id=pk, kind="provision")
    Operation.objects.filter(pk=operation.pk).update(updated_at=timezone.now() - timedelta(hours=1))
    assert ticking.tick()["resumed"] == 1
    steps.run()
    assert reservation(pk).state == "active"

    settings.MERIDIAN_RESUME_LIMIT = 0
    other = create(world)
    start_then_lose_the_first_step(steps)
    stuck = Operation.objects.get(reservation_id=other, kind="provision")
    Operation.objects.filter(pk=stuck.pk).update(updated_at=timezone.now() - timedelta(hours=1))
    assert ticking.tick()["failed_stuck"] == 1
    steps.run()
    given_up = Operation.objects.get(pk=stuck.pk)
    assert given_up.state == "failed" and "made no progress" in given_up.error
    assert reservation(other).state == "queued"  # placed again, not stuck in provisioning


def test_cancelling_while_provisioning_stops_it_and_cleans_up(world, fleet, steps):
    pk = create(world)
    what, reservation_id, _, _ = steps.queue.popleft()
    assert what == "start"
    starting.reservation_provision_start(reservation_id)
    _, operation_id, step, token = steps.queue.popleft()
    assert runner.operation_run_step(operation_id, step, token) == "done"  # powered on, then the tenant cancels
    response = world.client("t1_member").post(f"{URL}{pk}/cancel/")
    assert response.status_code == 200, response.json()
    steps.run()
    assert reservation(pk).state == "released"
    # Stopped on purpose by the cancel: a cancelled operation, not a failed one.
    assert Operation.objects.get(reservation_id=pk, kind="provision").state == "cancelled"
    node = Instance.objects.filter(reservation_id=pk).first().node
    assert Node.objects.get(pk=node.pk).state == "available"
    assert Simulated.calls("bmc", node.hostname)["set_power"] == 2


def test_a_step_whose_worker_dies_every_time_is_failed_not_redelivered_forever(world, fleet, steps):
    """Each delivery counts as an attempt even when the worker dies; past the limit it fails for good."""
    pk = create(world)
    start_then_lose_the_first_step(steps)
    operation = Operation.objects.get(reservation_id=pk, kind="provision")
    Operation.objects.filter(pk=operation.pk).update(attempt=5)  # five deliveries died with their worker
    StepRun.objects.create(operation=operation, name=operation.step, attempt=5)  # the last one, still "running"
    assert runner.operation_run_step(operation.pk, operation.step) == "failed"
    steps.run()
    assert reservation(pk).state == "queued"
    runs = list(StepRun.objects.filter(operation=operation).values_list("attempt", "state", "error"))
    assert runs[0][:2] == (5, "failed") and "worker was lost" in runs[0][2]
    assert runs[1][:2] == (6, "gave_up") and "died on every attempt" in runs[1][2]


def test_an_unexpected_error_in_a_step_is_retried_then_fails_cleanly(world, fleet, steps, monkeypatch):
    """A bug in a step is not left running for the reaper: it retries like a transient error, then fails."""
    from provisioning.lifecycle import steps as step_module

    def broken(ctx):
        raise ValueError("unexpected answer from the BMC")

    pipeline = step_module.PIPELINES[("provision", "bare_metal")]
    monkeypatch.setitem(step_module.PIPELINES, ("provision", "bare_metal"),
                        [step_module.Step(pipeline[0].name, broken), *pipeline[1:]])
    pk = create(world)
    steps.run()
    runs = list(StepRun.objects.filter(name="power_on_deploy").values_list("state", "error"))
    assert [state for state, _ in runs] == ["failed"] * 4 + ["gave_up"]
    assert all("unexpected error: ValueError" in error for _, error in runs)
    assert reservation(pk).state == "queued"


BARE_METAL_STEPS = ["power_on_deploy", "write_image", "boot_from_disk", "join_network", "verify", "hand_over"]


@pytest.mark.parametrize("failing", BARE_METAL_STEPS)
def test_a_failure_for_good_at_any_bare_metal_step_re_places_and_leaves_nothing_behind(
        world, fleet, steps, monkeypatch, failing):
    """Whichever step fails for good: the node is faulty, the reservation queued again, nothing stuck or held."""
    from provisioning.lifecycle import steps as step_module
    from provisioning.lifecycle.steps import NodeFault

    def broken(ctx):
        raise NodeFault(ctx.instances[0].node, f"{failing} failed for good", transient=False)

    pipeline = step_module.PIPELINES[("provision", "bare_metal")]
    monkeypatch.setitem(step_module.PIPELINES, ("provision", "bare_metal"),
                        [step_module.Step(s.name, broken if s.name == failing else s.run) for s in pipeline])
    pk = create(world)
    steps.run()
    queued = reservation(pk)
    assert queued.state == "queued" and queued.provision_failures == 1
    node = Instance.objects.get(reservation_id=pk).node
    assert Node.objects.get(pk=node.pk).state == "faulty"
    assert not Allocation.objects.filter(reservation_id=pk, ends_at__gt=timezone.now()).exists()
    assert not Operation.objects.filter(reservation_id=pk, state__in=["pending", "running"]).exists()
    assert Operation.objects.get(reservation_id=pk, kind="provision").state == "failed"
    # Its addresses went back to the pool: the next placement draws afresh.
    assert not AddressAssignment.objects.filter(instance__reservation_id=pk, released_at__isnull=True).exists()
