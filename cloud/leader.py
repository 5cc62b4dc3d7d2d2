"""
One leader among processes for singleton loops (the scheduler, the alert evaluator).

PostgreSQL: a session advisory lock, released by the server if the leader's connection dies.
SQLite (embedded): a lease row (cloud.LeaderLease) that the leader renews; a standby takes over
once it expires.
"""

from __future__ import annotations

import hashlib
import os
import socket
from datetime import timedelta

from django.db import connection, transaction
from django.utils import timezone

from cloud.models import LeaderLease


def advisory_key(name: str) -> int:
    return int.from_bytes(hashlib.sha256(f"meridian:{name}".encode()).digest()[:8], "big", signed=True)


class LeaderLock:
    """``acquire()`` each loop turn: True while this process leads. ``release()`` on the way out."""

    def __init__(self, name: str, *, lease: timedelta = timedelta(seconds=10)):
        self.name = name
        self.lease = lease
        self.holder = f"{socket.gethostname()}:{os.getpid()}"
        self.held = False
        self.pid = None

    def acquire(self) -> bool:
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                # The lock lives as long as the server session: a new backend (the connection was
                # closed or dropped) has lost it, so ask again rather than trust ``held``.
                cursor.execute("SELECT pg_backend_pid()")
                pid = cursor.fetchone()[0]
                if not self.held or pid != self.pid:
                    cursor.execute("SELECT pg_try_advisory_lock(%s)", [advisory_key(self.name)])
                    self.held, self.pid = bool(cursor.fetchone()[0]), pid
            return self.held
        now = timezone.now()
        with transaction.atomic():
            lease, created = LeaderLease.objects.get_or_create(
                name=self.name, defaults={"holder": self.holder, "expires_at": now + self.lease}
            )
            if created or lease.holder == self.holder or lease.expires_at <= now:
                LeaderLease.objects.filter(name=self.name).update(holder=self.holder, expires_at=now + self.lease)
                self.held = True
            else:
                self.held = False
        return self.held

    def release(self) -> None:
        if not self.held:
            return
        if connection.vendor == "postgresql":
            if connection.connection is not None:  # a closed session has released it already
                with connection.cursor() as cursor:
                    cursor.execute("SELECT pg_advisory_unlock(%s)", [advisory_key(self.name)])
        else:
            LeaderLease.objects.filter(name=self.name, holder=self.holder).delete()
        self.held = False
