"""
Start messages from a thread of their own (provisioning/start_sender.py): the committing thread
hands the ids over and goes on; the thread sends them, what piled up meanwhile together; a send
the broker refuses is logged and the thread lives on (the lifecycle tick starts those); a forked
process starts a thread of its own.
"""

import os
import threading
from unittest import mock

import pytest

from provisioning import lifecycle
from provisioning.models import Reservation
from provisioning.start_sender import StartSender
from tests.world import small_fleet, vm_offering


@pytest.fixture(autouse=True)
def in_background(settings):
    settings.MERIDIAN_SEND_STARTS_IN_BACKGROUND = True


def test_the_caller_does_not_wait_for_the_broker():
    gate, sent = threading.Event(), []

    def publish(ids):
        assert gate.wait(5)
        sent.append(ids)

    sender = StartSender(publish)
    sender.send(["a"])  # returns while the broker is slow
    assert sent == [] and not sender.wait_idle(0.05)
    sender.send(["b"])
    sender.send(["c"])
    gate.set()
    assert sender.wait_idle(5)
    assert sent == [["a"], ["b", "c"]]  # what piled up meanwhile went together


def test_a_refused_send_is_logged_and_the_thread_goes_on(caplog):
    calls = []

    def publish(ids):
        calls.append(ids)
        if len(calls) == 1:
            raise ConnectionError("the broker is down")

    sender = StartSender(publish)
    sender.send(["a"])
    assert sender.wait_idle(5)
    sender.send(["b"])
    assert sender.wait_idle(5)
    assert calls == [["a"], ["b"]]
    assert "the lifecycle tick starts them" in caplog.text


def test_turned_off_it_sends_in_the_callers_thread(settings):
    settings.MERIDIAN_SEND_STARTS_IN_BACKGROUND = False
    threads = []
    StartSender(lambda ids: threads.append(threading.current_thread())).send(["a"])
    assert threads == [threading.current_thread()]


def test_a_forked_process_sends_from_a_thread_of_its_own():
    threads = []
    sender = StartSender(lambda ids: threads.append(threading.current_thread()))
    sender.send(["a"])
    assert sender.wait_idle(5)
    with mock.patch("provisioning.start_sender.os.getpid", return_value=os.getpid() + 1):
        sender.send(["b"])
        assert sender.wait_idle(5)
    assert len(threads) == 2 and threads[0] is not threads[1]
    assert threading.current_thread() not in threads


def test_a_create_placed_at_once_answers_and_its_start_goes_out_after_the_commit(
        world, django_capture_on_commit_callbacks):
    Reservation.objects.all().delete()
    small_fleet(8)
    sent = []
    with mock.patch.object(lifecycle, "_publish_starts", lambda ids: sent.append((ids, threading.current_thread()))):
        with django_capture_on_commit_callbacks(execute=True):
            response = world.client("t1_member").post("/api/v1/reservations/", {
                "name": "now", "offering": vm_offering(1).slug, "gpus": 1, "regions": ["us-east-1"],
                "duration_hours": 1}, format="json")
        assert response.status_code == 201 and response.json()["state"] == "scheduled"
        assert lifecycle.START_SENDER.wait_idle(5)
    assert [ids for ids, _ in sent] == [[response.json()["id"]]]
    assert sent[0][1] is not threading.current_thread()


def test_a_broker_that_refuses_the_start_does_not_turn_a_committed_create_into_an_error(
        world, django_capture_on_commit_callbacks, caplog):
    """Sent in the request, the broker's refusal came after the commit: the client got a 500 for a
    reservation that exists. Sent by the thread, the client gets its 201 and the tick starts it."""
    Reservation.objects.all().delete()
    small_fleet(8)

    def refused(ids):
        raise ConnectionError("the broker is down")

    with mock.patch.object(lifecycle, "_publish_starts", refused):
        with django_capture_on_commit_callbacks(execute=True):
            response = world.client("t1_member").post("/api/v1/reservations/", {
                "name": "now", "offering": vm_offering(1).slug, "gpus": 1, "regions": ["us-east-1"],
                "duration_hours": 1}, format="json")
        assert lifecycle.START_SENDER.wait_idle(5)
    assert response.status_code == 201 and response.json()["state"] == "scheduled"
    assert "the lifecycle tick starts them" in caplog.text
    assert Reservation.objects.get(pk=response.json()["id"]).state == "scheduled"  # the tick's to start
