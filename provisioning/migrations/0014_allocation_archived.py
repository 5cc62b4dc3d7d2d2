"""
Allocations that ended long ago are ``archived`` and leave the no-overlap constraint: it becomes

    EXCLUDE USING gist (gpu_id WITH =, int4range(mem_lo, mem_hi) WITH &&,
                        tstzrange(starts_at, ends_at) WITH &&) WHERE (NOT archived)

so its index holds what is live or ended lately, not every allocation ever made (each placement
searched a GPU's whole history). The live allocations are indexed by end as well: the
scheduler's window and the archiver read them without the history. Only allocations that ended
before any new one can start are archived (provisioning.allocations.allocations_archive), so the
rule still holds for everything that can clash. SQLite has no such constraint
(provisioning.allocations checks the rule itself).
"""

from django.db import migrations, models

from provisioning.migrations._operations import AddIndexConcurrentlyOnPostgreSQL, PostgreSQLOnly

CONSTRAINT = "allocation_no_overlap"
EXPRESSIONS = "gpu_id WITH =, int4range(mem_lo, mem_hi) WITH &&, tstzrange(starts_at, ends_at) WITH &&"


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("provisioning", "0013_agentcommand_reset_gpu"),
    ]

    operations = [
        migrations.AddField(
            model_name="allocation",
            name="archived",
            field=models.BooleanField(db_default=False, default=False),
        ),
        AddIndexConcurrentlyOnPostgreSQL(
            model_name="allocation",
            index=models.Index(condition=models.Q(archived=False), fields=["ends_at"], name="allocation_live_end_idx"),
        ),
        PostgreSQLOnly(
            # One statement: never a moment without the rule (this migration is not atomic).
            sql=f"ALTER TABLE provisioning_allocation DROP CONSTRAINT {CONSTRAINT}, ADD CONSTRAINT {CONSTRAINT} "
                f"EXCLUDE USING gist ({EXPRESSIONS}) WHERE (NOT archived)",
            reverse_sql=f"ALTER TABLE provisioning_allocation DROP CONSTRAINT {CONSTRAINT}, ADD CONSTRAINT "
                        f"{CONSTRAINT} EXCLUDE USING gist ({EXPRESSIONS})",
        ),
    ]
