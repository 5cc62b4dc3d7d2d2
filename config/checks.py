"""
System checks about the database Meridian runs on (``manage.py check --database default``, and
``migrate``, which runs them).
"""

from django.core import checks
from django.db import connections


@checks.register(checks.Tags.database)
def autovacuum_on(app_configs, databases=None, **kwargs):
    """
    Every release rewrites a reservation and its allocation rows; without autovacuum their dead
    versions stay in the indexes the fast path and the scheduler read, and every create and cycle
    gets slower as they pile up. PostgreSQL has it on by default.
    """
    found = []
    for alias in databases or ():
        connection = connections[alias]
        if connection.vendor != "postgresql":
            continue
        with connection.cursor() as cursor:
            cursor.execute("SELECT setting FROM pg_settings WHERE name = 'autovacuum'")
            row = cursor.fetchone()
        if row and row[0] != "on":
            found.append(checks.Warning(
                f"PostgreSQL's autovacuum is off on the database '{alias}'.",
                hint="Turn it on (ALTER SYSTEM SET autovacuum = on; SELECT pg_reload_conf();), or VACUUM ANALYZE the "
                     "provisioning tables often: reservations and allocations are rewritten at every release, and "
                     "their dead rows slow every create and scheduler cycle until they are vacuumed.",
                id="meridian.W001",
            ))
    return found
