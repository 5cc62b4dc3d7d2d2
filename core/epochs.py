"""
Epochs: how every process learns, for the price of one read of the shared cache, that rows it
keeps in memory may have changed.

An epoch is a random value in the shared cache (Redis in a deployment, the file cache when
embedded). Every saved or deleted row of the models it watches replaces it -- when the change is
made and again after its commit, because a process that read the rows between the two would
otherwise keep the old rows under the new value. A process keeps what it read together with the
epoch it read *before* reading, and uses it only while the epoch is still that value. When the
shared cache cannot be read, the epoch matches nothing: every read goes to the database.

Changes made without a model signal (``QuerySet.update``, raw SQL) must call ``changed()``.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable

from django.core.cache import cache
from django.db import transaction
from django.db.models.signals import post_delete, post_save

log = logging.getLogger(__name__)

UNREADABLE = object()  # the value read when the cache cannot be read: equal to nothing kept


class Epoch:
    def __init__(self, key: str):
        self.key = key

    def read(self):
        try:
            return cache.get(self.key)
        except Exception:  # noqa: BLE001 -- the cache being down must not stop the request
            return UNREADABLE

    def changed(self) -> None:
        """Whatever a process kept under this epoch is stale: now, and again when the current transaction commits."""
        self._replace()
        transaction.on_commit(self._replace)

    def watch(self, *models) -> None:
        """Every saved or deleted row of ``models`` changes the epoch."""
        for model in models:
            for signal, name in ((post_save, "save"), (post_delete, "delete")):
                signal.connect(self._on_signal, sender=model, dispatch_uid=f"{self.key}-{name}-{model._meta.label}")

    def _on_signal(self, sender, **kwargs) -> None:
        self.changed()

    def _replace(self) -> None:
        try:
            cache.set(self.key, secrets.token_hex(8), None)
        except Exception:  # noqa: BLE001 -- a cache that cannot be written is mostly one that cannot be read
            log.warning("The epoch %s could not be written: processes may use rows they kept for a few seconds "
                        "more.", self.key, exc_info=True)


class KeptUnder:
    """
    Per process, thread-safe: values loaded from the database by key, each kept with the value of
    ``epoch`` read before it was loaded, and used while the epoch still has that value and for at
    most ``seconds()`` (0: never kept).
    """

    def __init__(self, epoch: Epoch, seconds: Callable[[], float], *, most: int = 10_000):
        self.epoch, self.seconds, self.most = epoch, seconds, most
        self._lock = threading.Lock()
        self._kept: dict = {}

    def get(self, key, load: Callable[[], object]):
        epoch = self.epoch.read()
        kept = self._kept.get(key)
        if (kept is not None and epoch is not UNREADABLE and kept[0] == epoch
                and time.monotonic() - kept[1] <= self.seconds()):
            return kept[2]
        value = load()
        if epoch is not UNREADABLE and self.seconds() > 0:
            with self._lock:
                if len(self._kept) >= self.most:
                    self._prune(epoch)
                self._kept[key] = (epoch, time.monotonic(), value)
        return value

    def _prune(self, epoch) -> None:
        """At ``most`` values (a process that served many tokens, say): the stale go, or else all."""
        oldest = time.monotonic() - self.seconds()
        self._kept = {key: kept for key, kept in self._kept.items() if kept[0] == epoch and kept[1] >= oldest}
        if len(self._kept) >= self.most:
            self._kept = {}

    def clear(self) -> None:
        with self._lock:
            self._kept.clear()
