from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("provisioning", "0032_instance_topology"),
    ]

    operations = [
        migrations.AddField(
            model_name="agentstate",
            name="ping_run",
            field=models.CharField(blank=True, db_default="", default="", max_length=32),
        ),
        migrations.AddField(
            model_name="agentstate",
            name="ping_seq",
            field=models.BigIntegerField(db_default=0, default=0),
        ),
        migrations.AddField(
            model_name="agentstate",
            name="alive_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="agentstate",
            name="ping_sent_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="agentstate",
            name="ping_rtt_ms",
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="agentstate",
            name="ping_failed",
            field=models.PositiveIntegerField(db_default=0, default=0),
        ),
    ]
