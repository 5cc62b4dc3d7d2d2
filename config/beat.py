"""
Celery beat with standbys: every beat process runs ``LeaderScheduler``; one leads and sends the
periodic tasks, the others poll for the lead every ``MERIDIAN_BEAT_STANDBY_POLL`` seconds.

Two guards keep a task from being sent twice for one due time:
- the lead is a ``cloud.leader.LeaderLock`` (a PostgreSQL session advisory lock, released by the
  server the moment a killed leader's connection closes; a lease row on SQLite);
- each send first claims its due run in the database with a compare-and-set on the entry's
  ``last_run_at``: only the process that moves it from the value it read sends the task. A
  leader that lost its connection, or two processes that both believe they lead, cannot both
  claim one run. Claiming before sending makes a run at most once: a leader killed between
  the claim and the send skips that one run, and the next is sent by the new leader.
A new leader reads every entry's ``last_run_at`` afresh, so what the old one sent is not due again.
"""

from __future__ import annotations

import contextlib
import logging
import time

from django.conf import settings
from django.db import DatabaseError, InterfaceError, close_old_connections, connection
from django.db.models import F
from django_celery_beat.models import PeriodicTask
from django_celery_beat.schedulers import DatabaseScheduler, ModelEntry

from cloud.leader import LeaderLock, advisory_key

log = logging.getLogger("meridian.beat")
RECHECK_S = 0.5


class LeaderEntry(ModelEntry):
    """An entry that remembers the ``last_run_at`` the database held (the base fills a missing one in)."""

    def __init__(self, model, app=None):
        stored = model.last_run_at
        super().__init__(model, app=app)
        self.stored_run_at = stored


class LeaderScheduler(DatabaseScheduler):
    Entry = LeaderEntry
    lock_name = "beat"

    def __init__(self, *args, **kwargs):
        self.lock = LeaderLock(self.lock_name)
        self.leading: bool | None = None  # neither yet: the first tick says which
        self._asked_at = 0.0
        self._claimed: set[str] = set()
        # The advisory lock lives with the database session: keep it open (no CONN_MAX_AGE recycling,
        # which would hand the lead to a standby every minute); a broken one is still replaced.
        connection.settings_dict["CONN_MAX_AGE"] = None
        connection.close_at = None
        super().__init__(*args, **kwargs)

    def tick(self, *args, **kwargs):
        if not self._lead():
            return settings.MERIDIAN_BEAT_STANDBY_POLL
        return super().tick(*args, **kwargs)

    def _lead(self) -> bool:
        # Several ticks a second while tasks fall due: the lock is asked about at most every half
        # second (each send is claimed in the database anyway), so SQLite's lease is not rewritten each time.
        now = time.monotonic()
        if self.leading and now - self._asked_at < RECHECK_S:
            return True
        self._asked_at = now
        try:
            close_old_connections()
            held = self.lock.acquire()
        except (DatabaseError, InterfaceError):
            log.warning("Beat cannot reach the database to hold its lead; standing by.", exc_info=True)
            self.lock.held = False
            held = False
        if held and not self.leading:
            log.info("Leading beat (%s): reading when each task last ran.", self.lock.holder)
            self._reread()
        elif self.leading is not False and not held:
            log.info("Standing by: another beat leads.")
        self.leading = held
        return held

    def setup_schedule(self):
        """Write the settings' entries to the database, one beat at a time (two starting together would race)."""
        if connection.vendor != "postgresql":
            return super().setup_schedule()
        # A session lock, not a transaction's: the base class closes a connection found inside one.
        key = advisory_key("beat-setup")
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_lock(%s)", [key])
        try:
            super().setup_schedule()
        finally:
            with contextlib.suppress(DatabaseError, InterfaceError), connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_unlock(%s)", [key])

    def reserve(self, entry):
        """Move the entry to its next run, claiming this run in the database first."""
        before = entry.stored_run_at
        new_entry = super().reserve(entry)
        self._dirty.discard(new_entry.name)  # written here, not at the next sync
        if self._schedule is not None:  # a heap rebuilt from the schedule must not find this run due again
            self._schedule[new_entry.name] = new_entry
        claim = PeriodicTask.objects.filter(pk=new_entry.model.pk)
        claim = claim.filter(last_run_at__isnull=True) if before is None else claim.filter(last_run_at=before)
        try:
            won = claim.update(last_run_at=new_entry.model.last_run_at, total_run_count=F("total_run_count") + 1)
        except (DatabaseError, InterfaceError):
            log.warning("Beat could not record %s's run; not sending it.", entry.name, exc_info=True)
            won = 0
        if won:
            self._claimed.add(new_entry.name)
        else:
            # Another beat ran it since this one read it: read the schedule again before going on.
            log.info("%s was run by another beat; reading the schedule again.", entry.name)
            self._reread()
        return new_entry

    def _reread(self) -> None:
        """The next tick reads every entry (and when it last ran) from the database and rebuilds its heap."""
        self._initial_read = True
        self._heap = None

    def apply_entry(self, entry, producer=None):
        if entry.name not in self._claimed:
            return
        self._claimed.discard(entry.name)
        super().apply_entry(entry, producer=producer)

    def close(self):
        with contextlib.suppress(DatabaseError, InterfaceError):  # a lost session released it already
            self.lock.release()
        super().close()
