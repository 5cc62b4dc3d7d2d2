"""
The start message of a reservation placed at once goes out after the commit, from the process's
sender thread (the answer does not wait for the broker); a broker that refuses it costs a few
seconds (the lifecycle tick starts the reservation), never an error for a create whose
reservation exists.
"""

import os
import threading
from unittest import mock

import pytest

from provisioning.lifecycle import dispatch as dispatching
from provisioning.lifecycle import tick as ticking
from provisioning.lifecycle.start_sender import StartSender
from provisioning.models import Reservation
from tests.world import small_fleet, vm_offering

URL = "/api/v1/reservations/"


@pytest.fixture
def fleet(world):
    Reservation.objects.all().delete()
    return small_fleet(8)


def create(world):
    return world.client("t1_member").post(URL, {
        "name": "now", "offering": vm_offering(1).slug, "gpus": 1, "regions": ["us-east-1"], "duration_hours": 1,
    }, format="json")


def test_the_start_goes_out_after_the_commit(world, fleet, django_capture_on_commit_callbacks):
    sent = []
    with mock.patch.object(dispatching, "_publish_starts", sent.append):
        with django_capture_on_commit_callbacks(execute=False) as callbacks:
            response = create(world)
        assert sent == []  # not before the commit
        for callback in callbacks:
            callback()
        assert dispatching.START_SENDER.flush()
    assert response.status_code == 201 and response.json()["state"] == "scheduled"
    assert sent == [[response.json()["id"]]]


def test_a_broker_that_refuses_the_start_is_not_an_error_and_the_tick_starts_it(
        world, fleet, django_capture_on_commit_callbacks, caplog):
    def refused(ids):
        raise ConnectionError("the broker is down")

    with mock.patch.object(dispatching, "_publish_starts", refused):
        with django_capture_on_commit_callbacks(execute=True):
            response = create(world)
        assert dispatching.START_SENDER.flush()  # the callbacks ran as the inner block closed
    assert response.status_code == 201, response.content
    assert "the lifecycle tick starts them" in caplog.text
    reservation = Reservation.objects.get(pk=response.json()["id"])
    assert reservation.state == "scheduled"
    report = ticking.tick()
    assert report["started"] == 1
    assert Reservation.objects.get(pk=reservation.pk).state == "provisioning"


class Recorder:
    """A publish that records what it got and, while ``held`` is clear, waits (a slow broker)."""

    def __init__(self, held=True):
        self.got, self.held, self.entered = [], threading.Event(), threading.Event()
        if held:
            self.held.set()

    def __call__(self, ids):
        self.entered.set()
        assert self.held.wait(5)
        if "bad" in ids:
            raise ConnectionError("refused")
        self.got.append(list(ids))


def test_the_sender_publishes_in_order_and_batches_what_came_while_it_was_busy():
    publish = Recorder(held=False)
    sender = StartSender(publish)
    sender.send(["a"])
    assert publish.entered.wait(5)  # "a" is out, the broker slow
    sender.send(["b", "c"])
    sender.send(["d"])
    assert not sender.flush(timeout=0.05)  # still out
    publish.held.set()
    assert sender.flush()
    assert publish.got == [["a"], ["b", "c", "d"]]


def test_starts_sent_within_the_linger_leave_together_and_a_full_batch_leaves_at_once():
    publish = Recorder()
    sender = StartSender(publish, linger_s=0.2, batch=3)
    sender.send(["a"])
    sender.send(["b"])
    assert sender.flush()
    assert publish.got == [["a", "b"]]
    sender.linger_s = 30.0
    sender.send(["c", "d"])
    sender.send(["e"])
    assert sender.flush(timeout=5)  # three waiting: no 30-second linger
    assert publish.got == [["a", "b"], ["c", "d", "e"]]


def test_a_publish_that_raises_leaves_the_sender_sending(caplog):
    publish = Recorder()
    sender = StartSender(publish)
    sender.send(["bad"])
    assert sender.flush()
    sender.send(["good"])
    assert sender.flush()
    assert publish.got == [["good"]]
    assert "the lifecycle tick starts them" in caplog.text


def test_without_a_thread_to_be_had_the_start_is_sent_at_once():
    publish = Recorder()
    sender = StartSender(publish)
    with mock.patch.object(threading.Thread, "start", side_effect=RuntimeError("can't start new thread")):
        sender.send(["now"])  # no error for the commit whose callback this is
    assert publish.got == [["now"]]
    sender.send(["later"])  # a thread again once one can be had
    assert sender.flush()
    assert publish.got == [["now"], ["later"]]


def test_a_forked_child_sends_its_own_starts_and_not_a_copy_of_the_parents():
    publish = Recorder(held=False)
    sender = StartSender(publish)
    sender.send(["parent-out"])
    assert publish.entered.wait(5)
    sender.send(["parent-waiting"])
    child = os.fork()
    if child == 0:  # pragma: no cover -- runs in the child, which reports by its exit status
        publish.held.set()
        sender.send(["child"])
        os._exit(0 if sender.flush() and publish.got == [["child"]] else 1)
    _, status = os.waitpid(child, 0)
    publish.held.set()
    assert sender.flush()
    assert os.waitstatus_to_exitcode(status) == 0
    assert publish.got == [["parent-out"], ["parent-waiting"]]
