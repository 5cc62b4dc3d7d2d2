"""
The embedded default's file-system broker (config.broker): a message appears whole or not at all.
Kombu's own channel created the file before writing it, and a worker that took it meanwhile read
nothing, stopped on a JSONDecodeError and lost the message.
"""

import json
import os
from types import SimpleNamespace

from kombu import Connection

import config.celery  # noqa: F401 -- the Celery app puts AtomicChannel in place, as in every process
from config.broker import PARTIAL, AtomicChannel


def connection(folder) -> Connection:
    options = {"data_folder_in": str(folder), "data_folder_out": str(folder), "polling_interval": 0.01,
               "control_folder": str(folder / "control")}  # kombu's default is ./control, in the checkout
    return Connection("filesystem://", transport_options=options)


def test_the_embedded_broker_uses_the_atomic_channel(tmp_path):
    with connection(tmp_path) as conn:
        assert isinstance(conn.default_channel, AtomicChannel)


def test_a_message_being_written_is_not_taken_and_a_whole_one_is(tmp_path):
    with connection(tmp_path) as conn:
        queue = conn.SimpleQueue("work")
        # A message still being written, as a publisher leaves it between open and rename.
        (tmp_path / f"1_partial.work.msg{PARTIAL}").write_bytes(b"")
        queue.put({"n": 1})
        assert [name for name in os.listdir(tmp_path) if name.endswith(".work.msg")], os.listdir(tmp_path)
        message = queue.get(timeout=2)
        assert message.payload == {"n": 1}
        message.ack()
        assert (tmp_path / f"1_partial.work.msg{PARTIAL}").exists()  # left alone, never decoded
        queue.close()


def test_while_a_message_is_written_no_file_of_the_queue_is_visible(tmp_path, monkeypatch):
    """What a polling worker could see mid-write: nothing under the name it takes (kombu's own showed it empty)."""
    import config.broker

    seen = []
    real = config.broker.dumps

    def watching(payload):
        seen.append(sorted(name for name in os.listdir(tmp_path) if name.endswith(".work.msg")))
        return real(payload)

    monkeypatch.setattr(config.broker, "dumps", watching)
    AtomicChannel._put(SimpleNamespace(data_folder_out=str(tmp_path)), "work", {"n": 2})
    assert seen == [[]]  # dumps ran while the message was being written: no file of the queue yet
    [name] = os.listdir(tmp_path)
    assert name.endswith(".work.msg") and json.loads((tmp_path / name).read_text()) == {"n": 2}
