"""
Transient database errors: the connection was lost (the server restarted, a failover, an
operator's ``pg_terminate_backend``), or PostgreSQL aborted the transaction for a conflict it
resolves by itself on a retry (a serialization failure, a deadlock). Nothing was committed, so
the same work done again on a fresh connection succeeds: a worker retries its task within
seconds (``config.celery.MeridianTask``) and the API answers 503 with ``Retry-After``
(``web.api.errors``), which a client retries with the same Idempotency-Key.

Anything else (a constraint, a bad query) is a bug or a conflict and is never retried blindly.
No Django models are imported here: the Celery app imports this before Django is set up.
"""

from __future__ import annotations

import psycopg
from django.db import DatabaseError, InterfaceError, OperationalError, connections

# SQLSTATE classes and codes (PostgreSQL, Appendix A): connection exceptions; the server shutting
# down, crashed, starting up or killing the session; too many connections; a serialization
# failure or a deadlock the server broke by aborting this transaction.
TRANSIENT_CLASSES = ("08",)
TRANSIENT_CODES = frozenset({"57P01", "57P02", "57P03", "57P05", "53300", "40001", "40P01"})
# How long a client or a task waits before trying again: a lost connection is made again at once,
# a restarting server or a failover takes a few seconds.
RETRY_AFTER_S = 2


def transient_database_error(exc: BaseException) -> bool:
    """Whether ``exc`` (Django's wrapper or the driver's own error) is a database error worth retrying as is."""
    raw = type(exc).__module__.startswith("psycopg")
    if not isinstance(exc, DatabaseError) and not raw:
        return False
    cause = exc if raw or exc.__cause__ is None else exc.__cause__
    sqlstate = getattr(cause, "sqlstate", None) or getattr(cause, "pgcode", None)
    if sqlstate:
        return sqlstate in TRANSIENT_CODES or sqlstate.startswith(TRANSIENT_CLASSES)
    if type(cause).__module__ == "sqlite3":
        return "locked" in str(cause)  # the embedded database: another writer held it past the timeout
    # psycopg without an SQLSTATE: it found the connection closed or broken ("the connection is
    # closed", "server closed the connection unexpectedly", "connection failed").
    return isinstance(exc, OperationalError | InterfaceError | psycopg.OperationalError | psycopg.InterfaceError)


def fresh_connections() -> None:
    """
    Drop every connection of this thread that is broken (or in a transaction nobody will finish),
    so the next query opens a new one. A sound idle connection is kept.
    """
    for connection in connections.all(initialized_only=True):
        if connection.connection is None:
            continue  # none open: the next query opens one
        if connection.in_atomic_block or not connection.is_usable():
            connection.close()


__all__ = ["RETRY_AFTER_S", "fresh_connections", "transient_database_error"]
