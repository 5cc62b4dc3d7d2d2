"""The queued reservations in submission order, ids included: the scheduler's every-cycle read is index-only."""

from django.db import migrations, models

from provisioning.migrations._operations import AddIndexConcurrentlyOnPostgreSQL


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("provisioning", "0014_allocation_archived"),
    ]

    operations = [
        AddIndexConcurrentlyOnPostgreSQL(
            model_name="reservation",
            index=models.Index(condition=models.Q(state="queued"), fields=["submitted_at", "id"],
                               name="reservation_queued_idx"),
        ),
    ]
