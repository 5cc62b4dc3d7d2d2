"""
Time-sliced slots carry the slice class of the GPU they share, and two classes never overlap in
time on one GPU, whatever memory each covers:

    EXCLUDE USING gist (gpu_id WITH =, share_class WITH <>, tstzrange(starts_at, ends_at) WITH &&)
        WHERE (share_class <> '' AND NOT archived)

Only time-sliced allocations are in its index (a handful beside the fleet's whole-GPU work). At
most eight tasks share a GPU because a time-sliced slot is at least an eighth of its memory and
the no-overlap constraint keeps slots apart. SQLite has no such constraint (provisioning.allocations
checks the rule itself).
"""

from django.db import migrations, models

from provisioning.migrations._operations import PostgreSQLOnly

CONSTRAINT = "allocation_one_slice_class"


class Migration(migrations.Migration):

    dependencies = [
        ("provisioning", "0027_reservation_committed"),
    ]

    operations = [
        migrations.AddField(
            model_name="allocation",
            name="share_class",
            field=models.CharField(blank=True, db_default="", default="", max_length=16),
        ),
        PostgreSQLOnly(
            sql=f"ALTER TABLE provisioning_allocation ADD CONSTRAINT {CONSTRAINT} EXCLUDE USING gist "
                "(gpu_id WITH =, share_class WITH <>, tstzrange(starts_at, ends_at) WITH &&) "
                "WHERE (share_class <> '' AND NOT archived)",
            reverse_sql=f"ALTER TABLE provisioning_allocation DROP CONSTRAINT {CONSTRAINT}",
        ),
    ]
