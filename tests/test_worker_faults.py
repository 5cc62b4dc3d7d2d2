"""
A real Celery worker on RabbitMQ is killed (SIGKILL) in the middle of a provisioning step.

The reservation is created through the API, so the web side of the pipeline is the real one:
its commit publishes ``provisioning.reservation_start_many`` through the project's Celery app, here
pointed at RabbitMQ and a queue of this test's own. A worker subprocess (its own queue, the test
database, the simulated hardware with ``write_image`` slowed to 4 s) takes the steps one by one
and is killed while it is inside the ``write_image`` driver call: either only the pool child that
runs the task (the worker's main process survives and starts a new child), or the whole worker
(a new worker is started on the same queue). Late acknowledgement and reject-on-worker-lost must
give the unacknowledged message back: the same task is received again, the step runs again and
the reservation becomes active -- provisioned once, with nothing repeated that had been done.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
from celery.signals import after_task_publish
from django.conf import settings
from kombu import Connection

from cloud.models import Node
from provisioning.drivers.simulated import Simulated
from provisioning.lifecycle import dispatch as dispatching
from provisioning.lifecycle.steps import PIPELINES
from provisioning.models import Allocation, Instance, Operation, Reservation, SimulatedDevice, StepRun
from tests.celery_app import app_on_broker
from tests.provisioning.factories import offering
from tests.provisioning.pipeline import SSH_KEY
from tests.test_celery_worker import BROKER, REPO, database_url_of_tests
from tests.world import small_fleet

pytestmark = pytest.mark.slow

URL = "/api/v1/reservations/"
STEPS = [step.name for step in PIPELINES[("provision", "bare_metal")]]
# The write_image driver call sleeps this long after counting itself: the window to kill it in.
SLOW_WRITE = {"latency_s": {"write_image": 4}}
RECEIVED = re.compile(r"Task (?P<name>[\w.]+)\[(?P<id>[0-9a-f-]+)\] received")


#
# Processes
#


def children_of() -> dict[int, list[int]]:
    """Every process's children, from /proc (this kernel has no /proc/<pid>/task/*/children)."""
    tree: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # gone meanwhile
        ppid = int(stat.rpartition(")")[2].split()[1])  # after "pid (comm)": state, ppid, ...
        tree.setdefault(ppid, []).append(int(entry.name))
    return tree


def descendants(pid: int) -> list[int]:
    tree, found, todo = children_of(), [], [pid]
    while todo:
        for child in tree.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def running(pid: int) -> bool:
    """The process exists and is not a zombie (an orphan's zombie may wait for a reaper that never comes)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


def kill(pid: int, sig: int = signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


class Worker:
    """``celery worker`` in a subprocess: one queue, one prefork child, the test database; its log in a file."""

    def __init__(self, name: str, queue: str, log_dir: Path, simulation: dict, *, app: str = "config",
                 env: dict | None = None):
        self.name = name
        # In the command line of the worker and of its pool children (forked from it): a process
        # without it is not this worker's, whatever its pid -- pids are reused (pid_max is often
        # 32768, and a busy suite wraps it), and a pid this test saw may be another process's
        # by the time it cleans up (make run's web server in a parallel test was killed so).
        self.marker = f"{queue}-{name}@".encode()
        self.log = log_dir / f"worker-{name}.log"
        env = {**os.environ, "DATABASE_URL": database_url_of_tests(), "CELERY_BROKER_URL": BROKER,
               "MERIDIAN_CELERY_QUEUE": queue, "MERIDIAN_SIMULATION": json.dumps(simulation),
               "PYTHONUNBUFFERED": "1", **(env or {})}
        env.pop("CELERY_BROKER_WRITE_URL", None)
        with self.log.open("w") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", app, "worker", "--queues", queue, "--concurrency", "1",
                 "--pool", "prefork", "--without-mingle", "--without-gossip", "--without-heartbeat",
                 "--loglevel", "INFO", "--hostname", f"{self.marker.decode()}%h"],
                cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
            )
        self.pid = self.process.pid
        self.pids_seen: set[int] = {self.pid}

    def alive(self) -> bool:
        return self.process.poll() is None

    def ours(self, pid: int) -> bool:
        """``pid`` is still this worker or one of its pool children, and running."""
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return False
        return self.marker in cmdline and running(pid)

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def received(self) -> list[tuple[str, str]]:
        """(task name, task id) of every message this worker received, in order."""
        return [(m["name"], m["id"]) for m in RECEIVED.finditer(self.output())]

    def pool_children(self) -> list[int]:
        children = [pid for pid in children_of().get(self.pid, []) if self.ours(pid)]
        self.pids_seen.update(children)
        return children

    def kill(self) -> list[int]:
        """
        SIGKILL the main process, then every process it had started; returns those still running
        after 10 s (none: nothing of the worker survives).
        """
        family = [pid for pid in descendants(self.pid) if self.ours(pid)]
        self.pids_seen.update(family)
        kill(self.pid)
        self.process.wait(timeout=10)
        for pid in family:
            if self.ours(pid):
                kill(pid)
        deadline = time.monotonic() + 10
        while (left := [pid for pid in self.pids_seen if self.ours(pid)]) and time.monotonic() < deadline:
            time.sleep(0.05)
        return left

    def stop(self) -> None:
        """Warm shutdown (SIGTERM), then SIGKILL whatever is left of it."""
        family = [pid for pid in descendants(self.pid) if self.ours(pid)] if self.alive() else []
        self.pids_seen.update(family)
        if self.alive():
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        for pid in self.pids_seen - {self.pid}:
            if self.ours(pid):
                kill(pid)

    def __str__(self) -> str:
        return f"--- worker {self.name} (pid {self.pid}, exit {self.process.poll()}) ---\n{self.output()[-6000:]}"


#
# Fixtures
#


@pytest.fixture
def queue():
    """A RabbitMQ queue of this test's own (parallel test processes never take each other's tasks)."""
    name = f"meridian-test-faults-{uuid.uuid4().hex[:12]}"
    yield name
    with Connection(BROKER) as conn:
        conn.default_channel.queue_delete(name)


@pytest.fixture
def published(queue):
    """
    The project's Celery app (what lifecycle's ``on_commit(... apply_async)`` uses) publishes to
    RabbitMQ and ``queue`` during the test; yields what this process published: (task, routing
    key, task id). Afterwards the app is as it was: its settings, producer pool and AMQP helper
    (Celery caches the broker connection pool in ``app._pool``, the producer pool and the queues
    in ``app.amqp``; kombu keeps both pools in global registries keyed by connection).
    """
    sent: list[tuple[str, str, str]] = []

    def record(sender=None, routing_key=None, headers=None, **_):
        sent.append((sender, routing_key, (headers or {}).get("id")))

    with app_on_broker(broker_url=BROKER, queue=queue, transport_options={"confirm_publish": True}) as connection:
        assert connection.transport.driver_type == "amqp", connection.as_uri()
        after_task_publish.connect(record, weak=False)
        try:
            yield sent
        finally:
            after_task_publish.disconnect(record)


@pytest.fixture
def workers(queue, tmp_path):
    """Start workers on ``queue`` (``workers.start(name, simulation)``); all are stopped afterwards."""

    class Workers(list):
        def start(self, name: str, simulation: dict, **options) -> Worker:
            worker = Worker(name, queue, tmp_path, simulation, **options)
            self.append(worker)
            return worker

        def stop(self) -> None:
            for worker in self:
                worker.stop()

        def __str__(self) -> str:
            return "\n".join(str(worker) for worker in self)

    started = Workers()
    yield started
    started.stop()


@pytest.fixture
def fleet(world):
    Reservation.objects.all().delete()  # the world's queued reservations: only ours is placed
    return small_fleet(4)


def wait_for(check, what: str, *, workers, timeout: float, must_live=()):
    """Poll ``check()`` until it is truthy; fail at the deadline or if a worker that must live died."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        for worker in must_live:
            assert worker.alive(), f"worker {worker.name} died while waiting for {what}\n{workers}"
        assert time.monotonic() < deadline, f"no {what} after {timeout:.0f} s\n{workers}"
        time.sleep(0.05)


def queue_depth(queue: str) -> tuple[int, int]:
    """(messages ready, consumers) of the queue, as RabbitMQ counts them."""
    with Connection(BROKER) as conn:
        _, messages, consumers = conn.default_channel.queue_declare(queue, passive=True)
    return messages, consumers


#
# The test
#


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("lost", ["pool_child", "whole_worker"])
def test_a_worker_killed_while_writing_the_image_is_redelivered_and_provisions_once(
        world, fleet, queue, published, workers, lost):
    first = workers.start("a", SLOW_WRITE)
    response = world.client("t1_member").post(URL, {
        "name": "job", "offering": offering("bare_metal", 8).slug, "regions": ["us-east-1"], "duration_hours": 2,
        "ssh_public_key": SSH_KEY, "nodes": 1}, format="json")
    assert response.status_code == 201, response.json()
    pk = response.json()["id"]
    # The API's commit handed the start to the process's sender, which published it through
    # RabbitMQ (publisher confirms) to our queue...
    assert dispatching.START_SENDER.flush()
    assert [(task, key) for task, key, _ in published] == [("provisioning.reservation_start_many", queue)]
    start_id = published[0][2]

    def killable():
        """write_image is running and its driver call counted itself: it is in its 4 s sleep."""
        run = StepRun.objects.filter(operation__reservation_id=pk, name="write_image", state="running").first()
        if run is None:
            return None
        hostname = Instance.objects.get(reservation_id=pk).node.hostname
        return hostname if Simulated.calls("disk", hostname).get("write_image") == 1 else None

    hostname = wait_for(killable, "write_image in its driver call", workers=workers, timeout=45, must_live=[first])
    # ... and that worker, which reads only that queue on RabbitMQ, received it.
    assert ("provisioning.reservation_start_many", start_id) in first.received(), str(workers)
    in_flight = first.received()[-1]
    assert in_flight[0] == "provisioning.operation_step", str(workers)

    if lost == "pool_child":
        children = first.pool_children()
        assert len(children) == 1, f"expected one pool child of {first.pid}, found {children}\n{workers}"
        kill(children[0])
        survivors = [first]
        # The main process notices the lost child (within ~5 s here), reports WorkerLostError, rejects
        # the message with requeue (reject_on_worker_lost) and starts a new child; RabbitMQ redelivers.
        wait_for(lambda: first.received().count(in_flight) == 2, "redelivery to the surviving worker",
                 workers=workers, timeout=30, must_live=survivors)
        assert "WorkerLostError" in first.output(), str(workers)
        assert children[0] not in first.pool_children() and not first.ours(children[0]), str(workers)
    else:
        assert len(first.pool_children()) == 1, str(workers)
        survived = first.kill()
        assert not survived, f"{survived} of {sorted(first.pids_seen)} survived SIGKILL\n{workers}"
        second = workers.start("b", {})
        survivors = [second]
        # RabbitMQ saw the connection close with the message unacknowledged: it goes to the new worker.
        wait_for(lambda: in_flight in second.received(), "redelivery to the new worker", workers=workers,
                 timeout=30, must_live=survivors)
        assert second.received()[0] == in_flight, str(workers)  # the first message it got

    wait_for(lambda: Reservation.objects.filter(pk=pk, state="active").exists(), "active reservation",
             workers=workers, timeout=60, must_live=survivors)

    # Provisioned once: one instance, one operation, every step succeeded once.
    instances = list(Instance.objects.filter(reservation_id=pk).select_related("node"))
    assert [(i.node.hostname, i.state) for i in instances] == [(hostname, "active")], str(workers)
    node = instances[0].node
    operations = list(Operation.objects.filter(reservation_id=pk, kind="provision"))
    assert [(o.state, o.progress) for o in operations] == [("succeeded", 100)], str(workers)
    assert not Operation.objects.filter(reservation_id=pk).exclude(kind__in=["place", "provision"]).exists()
    runs = list(StepRun.objects.filter(operation=operations[0]).order_by("started_at")
                .values_list("name", "attempt", "state"))
    # The redelivery closes the killed attempt as failed (its worker was lost) and runs attempt 2.
    assert runs == [("power_on_deploy", 1, "succeeded"), ("write_image", 1, "failed"),
                    ("write_image", 2, "succeeded"), *[(name, 1, "succeeded") for name in STEPS[2:]]], str(workers)
    succeeded = Counter(name for name, _, state in runs if state == "succeeded")
    assert succeeded == dict.fromkeys(STEPS, 1)

    # The hardware: the image written once. The killed call counted itself before its sleep (the
    # test waited for that count before the kill) and died before its change, so the disk had no
    # image when the step ran again and wrote it: two calls, one write. Nothing else was repeated.
    disk = SimulatedDevice.objects.get(key=f"disk:{hostname}")
    instance = Instance.objects.get(reservation_id=pk)
    assert disk.state == {"image": settings.MERIDIAN_OS_IMAGE, "ssh_key": SSH_KEY, "marker": str(instance.pk)}
    assert Simulated.calls("disk", hostname) == {"write_image": 2}
    # The deploy image, then the config drive: each inserted once; powered on, off and on into the OS.
    assert Simulated.calls("bmc", hostname) == {"insert_media": 2, "set_boot_device": 2, "set_power": 3,
                                                "eject_media": 1}
    assert Simulated.calls("host", hostname) == {"use": 1, "attest": 1}  # attested once, before the hand-over

    # The node is this reservation's alone.
    assert Node.objects.get(pk=node.pk).state == "allocated"
    assert not Allocation.objects.filter(node=node).exclude(reservation_id=pk).exists()
    assert set(Allocation.objects.filter(reservation_id=pk).values_list("node_id", flat=True)) == {node.pk}
    assert Allocation.objects.filter(reservation_id=pk).count() == node.gpus.count()

    # Every message was acknowledged: after a warm shutdown nothing is left in the queue.
    workers.stop()
    assert queue_depth(queue) == (0, 0), str(workers)
    assert len(published) == 1  # this process published only the start; the steps came from the workers
