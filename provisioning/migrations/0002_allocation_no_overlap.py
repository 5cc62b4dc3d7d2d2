"""
No two allocations of the same GPU memory overlap in time, enforced by PostgreSQL:

    EXCLUDE USING gist (gpu_id WITH =, int4range(mem_lo, mem_hi) WITH &&,
                        tstzrange(starts_at, ends_at) WITH &&)

Ranges are half-open, so back-to-back allocations are fine. On SQLite (the embedded default)
the operation does nothing: provisioning.allocations checks the same rule inside the IMMEDIATE
write transaction, which serialises every writer.
"""

from django.db import migrations

from provisioning.migrations._operations import PostgreSQLOnly

CONSTRAINT = "allocation_no_overlap"


class Migration(migrations.Migration):
    dependencies = [("provisioning", "0001_initial")]

    operations = [
        PostgreSQLOnly(
            sql=[
                "CREATE EXTENSION IF NOT EXISTS btree_gist",
                f"""ALTER TABLE provisioning_allocation ADD CONSTRAINT {CONSTRAINT}
                    EXCLUDE USING gist (gpu_id WITH =, int4range(mem_lo, mem_hi) WITH &&,
                                        tstzrange(starts_at, ends_at) WITH &&)""",
            ],
            reverse_sql=[f"ALTER TABLE provisioning_allocation DROP CONSTRAINT {CONSTRAINT}"],
        )
    ]
