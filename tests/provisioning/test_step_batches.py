"""
Reservations started together (a scheduler cycle's message) go through their steps together:
one message and one bookkeeping transaction per step for the batch, each operation's own
history kept, and an operation whose step waits, retries, fails or is stopped leaves the batch
without holding the others back.
"""

import pytest
from django.conf import settings

from provisioning.drivers import DriverError
from provisioning.drivers.simulated import Simulated
from provisioning.lifecycle import dispatch as dispatching
from provisioning.lifecycle import runner
from provisioning.lifecycle import start as starting
from provisioning.lifecycle import tick as ticking
from provisioning.lifecycle.steps import PIPELINES, Step
from provisioning.models import Instance, Operation, StepRun
from security.models import AuditEvent
from tests.provisioning.factories import offering
from tests.provisioning.pipeline import reservation
from tests.provisioning.test_lifecycle import create, fleet, release  # noqa: F401 -- the fixture

VM_STEPS = [step.name for step in PIPELINES[("provision", "vm")]]
SEND = dispatching.enqueue  # the lifecycle's own sending (the steps fixture puts a collector in its place)


class WorkerLost(BaseException):
    """The worker died (a BaseException, as SystemExit is: nothing in the lifecycle catches it)."""


@pytest.fixture
def started_together(world, fleet, steps, monkeypatch):  # noqa: F811
    """Three 1-GPU VMs placed, then started by one message as a scheduler cycle sends them."""
    ids = [create(world, offering("vm", 1), gpus=1) for _ in range(3)]
    assert [what for what, *_ in steps.queue] == ["start"] * 3
    steps.queue.clear()
    steps.queue.append(("starts", ids, None, None))
    messages = []
    real = runner.operation_run_step

    def recorded(operation_ids, step, dispatch=None):
        messages.append((step, operation_ids if isinstance(operation_ids, list) else [operation_ids]))
        return real(operation_ids, step, dispatch)

    monkeypatch.setattr(runner, "operation_run_step", recorded)
    return ids, messages


def test_a_batch_goes_through_each_step_in_one_message_with_each_operations_history(started_together, steps):
    ids, messages = started_together
    steps.run()
    assert {reservation(pk).state for pk in ids} == {"active"}
    assert [(step, len(batch)) for step, batch in messages] == [(step, 3) for step in VM_STEPS]
    for pk in ids:
        operation = Operation.objects.get(reservation_id=pk, kind="provision")
        assert (operation.state, operation.progress) == ("succeeded", 100)
        runs = StepRun.objects.filter(operation=operation).order_by("pk").values_list("name", "attempt", "state")
        assert list(runs) == [(step, 1, "succeeded") for step in VM_STEPS]
    instances = Instance.objects.filter(reservation_id__in=ids)
    assert {instance.state for instance in instances} == {"active"}
    zone = settings.MERIDIAN_DNS_ZONE
    assert all(i.address == f"{i.name}.{i.reservation.tenant.slug}.us-east-1.{zone}" and i.ssh_user == "ubuntu"
               for i in instances.select_related("reservation__tenant"))
    assert len({i.private_ip for i in instances}) == len(instances)  # each its own address
    activated = AuditEvent.objects.filter(action="reservation.active", target_id__in=[str(pk) for pk in ids])
    assert sorted(event.target_id for event in activated) == sorted(str(pk) for pk in ids)
    assert all(event.after == {"state": "active"} and event.tenant_id for event in activated)


def test_a_chained_batch_records_each_step_once_for_them_all(started_together, steps, settings):
    """Closing a step and opening the next: one UPDATE and one INSERT of step rows for the batch."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    settings.MERIDIAN_STEP_CHAIN_SECONDS = 5
    ids, messages = started_together
    with CaptureQueriesContext(connection) as queries:
        steps.run()
    assert {reservation(pk).state for pk in ids} == {"active"}
    assert [(step, len(batch)) for step, batch in messages] == [(VM_STEPS[0], 3)]  # one task, start to end
    sql = [q["sql"] for q in queries.captured_queries]
    assert sum(s.startswith('INSERT INTO "provisioning_steprun"') for s in sql) == len(VM_STEPS)
    assert sum(s.startswith('UPDATE "provisioning_steprun"') for s in sql) == len(VM_STEPS)
    if connection.vendor == "postgresql":
        # Reservations, then operations, each in key order: a batch never waits on a cancel in a cycle.
        locks = [s.split(" FROM ")[1].split()[0].strip('"') for s in sql if " FOR UPDATE" in s]
        step_locks = [t for t in locks if t in ("provisioning_reservation", "provisioning_operation")]
        assert step_locks[-2:] == ["provisioning_reservation", "provisioning_operation"]


def test_a_transient_fault_in_one_operation_retries_it_alone(started_together, steps, monkeypatch):
    ids, messages = started_together
    pipeline = PIPELINES[("provision", "vm")]
    unlucky, failed = str(ids[1]), []

    def start_or_time_out(ctx):
        if str(ctx.reservation.pk) == unlucky and not failed:
            failed.append(ctx.operation.pk)
            raise DriverError("simulated: the hypervisor timed out")
        pipeline[1].run(ctx)

    monkeypatch.setitem(PIPELINES, ("provision", "vm"),
                        [pipeline[0], Step("start_domain", start_or_time_out), *pipeline[2:]])
    steps.run()
    assert {reservation(pk).state for pk in ids} == {"active"}
    # The two others went on together; the unlucky one was sent again alone, and went on alone.
    assert sorted((step, len(batch)) for step, batch in messages) == sorted([
        ("define_domain", 3), ("start_domain", 3), ("start_domain", 1),
        ("join_network", 2), ("verify", 2), ("hand_over", 2), ("join_network", 1), ("verify", 1), ("hand_over", 1)])
    assert all(str(failed[0]) not in map(str, batch) for step, batch in messages if len(batch) == 2)
    runs = StepRun.objects.filter(operation_id=failed[0], name="start_domain").order_by("pk")
    assert [(run.attempt, run.state) for run in runs] == [(1, "failed"), (2, "succeeded")]
    assert "timed out" in runs[0].error


def test_a_reservation_released_mid_batch_stops_alone(started_together, world, steps, monkeypatch):
    ids, _ = started_together
    pipeline = PIPELINES[("provision", "vm")]
    leaving = ids[0]

    def start_then_one_released(ctx):
        pipeline[1].run(ctx)
        if str(ctx.reservation.pk) == str(leaving) and reservation(leaving).state == "provisioning":
            release(world, leaving)  # the tenant lets go while the batch is inside the step

    monkeypatch.setitem(PIPELINES, ("provision", "vm"),
                        [pipeline[0], Step("start_domain", start_then_one_released), *pipeline[2:]])
    steps.run()
    assert reservation(leaving).state == "released"
    assert {reservation(pk).state for pk in ids[1:]} == {"active"}
    stopped = Operation.objects.get(reservation_id=leaving, kind="provision")
    assert stopped.state == "cancelled" and "released" in stopped.error  # stopped on purpose, not failed
    assert not StepRun.objects.filter(operation=stopped, name="join_network").exists()


def test_a_batch_redelivered_after_its_worker_died_repeats_no_side_effect(started_together, steps, monkeypatch):
    """Every step's commit dies once; the redelivered message finds each domain defined and started."""
    ids, _ = started_together
    real, crashed = runner._steps_succeeded, set()

    def crash_once_before_commit(succeeded, **kwargs):
        step = succeeded[0][1].name
        if step not in crashed:
            crashed.add(step)
            raise WorkerLost
        return real(succeeded, **kwargs)

    monkeypatch.setattr(runner, "_steps_succeeded", crash_once_before_commit)
    steps.run(redeliver=WorkerLost)
    assert {reservation(pk).state for pk in ids} == {"active"}
    assert crashed == set(VM_STEPS)
    hosts = {instance.node.hostname for instance in Instance.objects.filter(reservation_id__in=ids)}
    calls = [Simulated.calls("hypervisor", host) for host in hosts]
    assert sum(c.get("define", 0) for c in calls) == 3 and sum(c.get("start", 0) for c in calls) == 3
    for pk in ids:  # each step's lost run is on record, then the one that finished it
        runs = StepRun.objects.filter(operation__reservation_id=pk, name="define_domain").order_by("pk")
        assert [(run.attempt, run.state) for run in runs] == [(1, "failed"), (2, "succeeded")]


def test_a_batch_joins_its_network_with_one_fabric_call_per_partition(started_together, world, steps):
    from provisioning.models import PortMembership, VirtualFunction

    ids, _ = started_together
    steps.run()
    assert {reservation(pk).state for pk in ids} == {"active"}
    instances = list(Instance.objects.filter(reservation_id__in=ids).select_related("node__fabric__region"))
    fabrics = {(i.node.fabric.region.slug, i.node.fabric.slug) for i in instances}
    assert len(fabrics) == 1
    [(region, fabric)] = fabrics
    calls = Simulated.calls("fabric", f"{region}/{fabric}")
    assert calls["set_members"] == 2  # the VPC's partition and the default one, for the three at once
    rows = PortMembership.objects.filter(instance__in=instances, left_at__isnull=True)
    assert rows.count() == 3 and len({row.address for row in rows}) == 3
    functions = VirtualFunction.objects.filter(instance__in=instances)
    assert functions.count() == 3 and {vf.guid for vf in functions} == {row.guid for row in rows}
    # Released, the functions are free again: the next batch takes them rather than making more.
    for pk in ids:
        release(world, pk)
    steps.run()
    made = VirtualFunction.objects.count()
    again = [create(world, offering("vm", 1), gpus=1) for _ in range(3)]
    steps.queue.clear()
    assert starting.reservations_start(again) == 3
    steps.run()
    assert {reservation(pk).state for pk in again} == {"active"}
    assert VirtualFunction.objects.count() == made
    assert VirtualFunction.objects.filter(instance__reservation_id__in=again).count() == 3


def test_a_batch_step_that_fails_finds_the_faulty_operation_alone(started_together, steps, monkeypatch):
    """One instance's port cannot be had: the batch's join fails, each then joins alone and only that one fails."""
    from provisioning.networks import ports as network

    ids, _ = started_together
    real, asked = network._memberships, []

    def memberships(vpc, members):
        asked.append(len(members))
        if any(str(instance.reservation_id) == str(ids[2]) for instance, _ in members):
            raise DriverError("simulated: the host's HCA does not answer", transient=False)
        return real(vpc, members)

    monkeypatch.setattr(network, "_memberships", memberships)
    steps.run()
    assert {reservation(pk).state for pk in ids[:2]} == {"active"}
    failed = StepRun.objects.get(operation__reservation_id=ids[2], name="join_network", state="gave_up")
    assert "does not answer" in failed.error
    assert reservation(ids[2]).state == "queued"  # placed again, keeping its place
    assert asked == [3, 1, 1, 1]  # the batch tried first, then each alone


def test_a_batch_start_leaves_what_cannot_start_and_starts_the_rest(world, fleet, steps):  # noqa: F811
    """In one message: a GPU still being scrubbed waits for the tick, a GPU quarantined meanwhile is placed again."""
    from cloud.models import GPU
    from provisioning.models import Allocation

    ids = [create(world, offering("vm", 1), gpus=1) for _ in range(3)]
    steps.queue.clear()
    waiting, moved, ready = ids
    for pk, state in ((waiting, "scrubbing"), (moved, "quarantined")):
        GPU.objects.filter(pk__in=Allocation.objects.filter(reservation_id=pk).values("gpu")).update(state=state)
    assert starting.reservations_start(ids) == 1
    assert reservation(waiting).state == "scheduled"  # the tick tries again once the scrub is done
    assert reservation(moved).state == "queued" and "quarantined" in reservation(moved).state_reason
    assert reservation(ready).state == "provisioning"
    assert Instance.objects.filter(reservation_id__in=[waiting, moved]).count() == 0
    assert AuditEvent.objects.filter(action="reservation.provision", target_id=str(ready)).count() == 1
    steps.run()
    assert reservation(ready).state == "active"


def test_a_start_message_takes_on_reservations_placed_moments_ago(world, fleet, steps):  # noqa: F811
    """Creates placed at once send a message each: the first to run starts them all, the others find them started."""
    from datetime import timedelta

    from django.utils import timezone

    from provisioning.models import Reservation

    ids = [create(world, offering("vm", 1), gpus=1) for _ in range(4)]
    steps.queue.clear()
    earlier = ids.pop()  # placed a while ago: its start is the tick's to retry, not a burst's
    Reservation.objects.filter(pk=earlier).update(scheduled_at=timezone.now() - starting.JUST_PLACED * 2)
    assert starting.reservations_start([ids[0]]) == 3
    assert {reservation(pk).state for pk in ids} == {"provisioning"}
    assert reservation(earlier).state == "scheduled"
    assert [len(batch) for what, batch, *_ in steps.queue] == [3]  # one message takes the three through their steps
    assert starting.reservations_start([ids[1]]) == 0  # its own message, come later: nothing left to do
    steps.run()
    assert {reservation(pk).state for pk in ids} == {"active"}
    assert ticking.tick(now=timezone.now() + timedelta(seconds=1))["started"] == 1
    steps.run()
    assert reservation(earlier).state == "active"


def test_bare_metal_servers_started_together_are_deployed_as_a_batch(world, fleet, steps):  # noqa: F811
    """Two servers, one message: each node taken, both deployed step by step together, each on its own ports."""
    from cloud.models import Node
    from provisioning.models import PortMembership

    ids = [create(world, offering("bare_metal", 8), nodes=1) for _ in range(2)]
    steps.queue.clear()
    assert starting.reservations_start(ids) == 2
    [(what, batch, step, _)] = list(steps.queue)
    assert (len(batch), step) == (2, "power_on_deploy")
    steps.run()
    assert {reservation(pk).state for pk in ids} == {"active"}
    servers = list(Instance.objects.filter(reservation_id__in=ids).select_related("node"))
    assert len({server.node_id for server in servers}) == 2
    assert set(Node.objects.filter(pk__in=[s.node_id for s in servers]).values_list("state", flat=True)) == {
        "allocated"}
    for server in servers:
        live = PortMembership.objects.filter(instance=server, left_at__isnull=True)
        joined = set(live.values_list("guid", flat=True))
        assert joined and joined == set(server.node.ib_ports.values_list("guid", flat=True))
        assert Simulated.calls("disk", server.node.hostname) == {"write_image": 1}


def test_reservations_ending_at_the_same_tick_are_cleaned_as_a_batch(
        started_together, steps, monkeypatch, django_capture_on_commit_callbacks):
    from datetime import timedelta

    from django.utils import timezone

    from provisioning import task_names

    ids, _ = started_together
    steps.run()
    assert {reservation(pk).state for pk in ids} == {"active"}
    sent = []
    monkeypatch.setattr(dispatching, "enqueue", SEND)
    monkeypatch.setattr(task_names, "send", lambda name, args, countdown=0: sent.append(args))
    with django_capture_on_commit_callbacks(execute=True):
        report = ticking.tick(now=timezone.now() + timedelta(hours=3))
    assert report["expired"] >= 3 and report["errors"] == 0  # ours, and what else the world had running
    ours = {str(pk) for pk in Operation.objects.filter(reservation_id__in=ids, kind="release").values_list("pk",
                                                                                                      flat=True)}
    assert all(isinstance(carried, list) and len(carried) <= dispatching.STARTS_PER_TASK for carried, _, _ in sent)
    carrying = [(carried, step) for carried, step, _ in sent if ours & set(carried)]
    assert len(carrying) == 1 and ours <= set(carrying[0][0]) and carrying[0][1] == "stop_domain", sent
    everything = [pk for carried, _, _ in sent for pk in carried]
    assert len(everything) == len(set(everything))  # each operation in one message
    for carried, step, token in sent:
        steps.queue.append(("step", carried, step, token))
    monkeypatch.setattr(dispatching, "enqueue", steps.enqueue)  # the steps after, collected here again
    steps.run()
    assert {reservation(pk).state for pk in ids} == {"released"}
    assert set(Instance.objects.filter(reservation_id__in=ids).values_list("state", flat=True)) == {"released"}


def test_what_is_sent_together_is_only_what_was_committed(fleet, monkeypatch,  # noqa: F811
                                                          django_capture_on_commit_callbacks):
    from django.db import transaction

    from provisioning import task_names

    sent = []
    monkeypatch.setattr(task_names, "send", lambda name, args, countdown=0: sent.append(args))
    node = fleet[0]
    kept = Operation.objects.create(node=node, kind="validate", step="check_bmc")
    retried = Operation.objects.create(node=node, kind="validate", step="check_bmc")
    with django_capture_on_commit_callbacks(execute=True), dispatching.dispatch_together():
        SEND(kept, "check_bmc")
        SEND(retried, "check_bmc", countdown=4)  # a retry keeps its delay: sent on its own
        with pytest.raises(RuntimeError), transaction.atomic():
            SEND(Operation.objects.create(node=node, kind="validate", step="check_bmc"), "check_bmc")
            raise RuntimeError("the tick's item failed: its operation is gone")
    assert sent == [(str(retried.pk), "check_bmc", Operation.objects.get(pk=retried.pk).dispatch),
                    ([str(kept.pk)], "check_bmc", Operation.objects.get(pk=kept.pk).dispatch)]
