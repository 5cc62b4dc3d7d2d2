"""
cloud/epochs.py: values kept under an epoch are used while it holds and for their time only,
never when the shared cache cannot be read, and a process keeps a bounded number of them.
"""

from unittest import mock

from core import epochs
from core.epochs import Epoch, KeptUnder


def kept(seconds=30.0, most=10_000):
    return KeptUnder(Epoch("test:epoch"), lambda: seconds, most=most)


def test_a_value_is_loaded_once_while_the_epoch_holds_and_again_when_it_changes(db, django_capture_on_commit_callbacks):
    store, loads = kept(), []
    for _ in range(3):
        store.get("k", lambda: loads.append(1) or len(loads))
    assert loads == [1]
    with django_capture_on_commit_callbacks(execute=True):
        store.epoch.changed()
    assert store.get("k", lambda: loads.append(1) or len(loads)) == 2


def test_nothing_is_kept_when_the_cache_cannot_be_read_or_the_time_is_zero():
    loads = []
    with mock.patch.object(epochs, "cache", mock.Mock(**{"get.side_effect": ConnectionError("down")})):
        store = kept()
        store.get("k", lambda: loads.append(1))
        store.get("k", lambda: loads.append(1))
    store = kept(seconds=0)
    store.get("k", lambda: loads.append(1))
    store.get("k", lambda: loads.append(1))
    assert len(loads) == 4


def test_a_process_keeps_at_most_so_many_values():
    store = kept(most=3)
    for key in range(10):
        store.get(key, lambda key=key: key)
        assert len(store._kept) <= 3
    assert store.get(9, lambda: "loaded again") == 9  # the newest stays
