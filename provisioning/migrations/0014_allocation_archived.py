"""
Allocations that ended long ago are ``archived`` and leave the no-overlap constraint: it becomes

    EXCLUDE USING gist (gpu_id WITH =, int4range(mem_lo, mem_hi) WITH &&,
                        tstzrange(starts_at, ends_at) WITH &&) WHERE (NOT archived)

so its index holds what is live or ended lately, not every allocation ever made (each placement
searched a GPU's whole history). The live allocations are indexed by end as well: the
scheduler's window and the archiver read them without the history. Only allocations that ended before any new one can start are
archived (provisioning.allocations.allocations_archive), so the rule still holds for everything
that can clash. SQLite has no such constraint (provisioning.allocations checks the rule itself).
"""

from django.db import migrations, models

CONSTRAINT = "allocation_no_overlap"
EXPRESSIONS = "gpu_id WITH =, int4range(mem_lo, mem_hi) WITH &&, tstzrange(starts_at, ends_at) WITH &&"


class PostgreSQLOnly(migrations.RunSQL):
    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor == "postgresql":
            super().database_forwards(app_label, schema_editor, from_state, to_state)

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor == "postgresql":
            super().database_backwards(app_label, schema_editor, from_state, to_state)


class AddIndexConcurrentlyOnPostgreSQL(migrations.AddIndex):
    """Built without blocking writes where the database can (PostgreSQL, outside a transaction)."""

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        model = to_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            schema_editor.add_index(model, self.index, **(
                {"concurrently": True} if schema_editor.connection.vendor == "postgresql" else {}))


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
