"""
Allocations that ended long ago are ``archived`` and leave the no-overlap constraint: it becomes

    EXCLUDE USING gist (gpu_id WITH =, int4range(mem_lo, mem_hi) WITH &&,
                        tstzrange(starts_at, ends_at) WITH &&) WHERE (NOT archived)

so its index holds what is live or ended lately, not every allocation ever made (each placement
searched a GPU's whole history). Only allocations that ended before any new one can start are
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


class Migration(migrations.Migration):

    dependencies = [
        ("provisioning", "0014_allocation_end_index"),
    ]

    operations = [
        migrations.AddField(
            model_name="allocation",
            name="archived",
            field=models.BooleanField(db_default=False, default=False),
        ),
        PostgreSQLOnly(
            sql=[
                f"ALTER TABLE provisioning_allocation DROP CONSTRAINT {CONSTRAINT}",
                f"ALTER TABLE provisioning_allocation ADD CONSTRAINT {CONSTRAINT} "
                f"EXCLUDE USING gist ({EXPRESSIONS}) WHERE (NOT archived)",
            ],
            reverse_sql=[
                f"ALTER TABLE provisioning_allocation DROP CONSTRAINT {CONSTRAINT}",
                f"ALTER TABLE provisioning_allocation ADD CONSTRAINT {CONSTRAINT} EXCLUDE USING gist ({EXPRESSIONS})",
            ],
        ),
    ]
