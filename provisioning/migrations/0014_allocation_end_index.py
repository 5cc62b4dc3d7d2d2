from django.db import migrations, models


class AddIndexConcurrentlyOnPostgreSQL(migrations.AddIndex):
    """
    Build the index without blocking writes where the database can (PostgreSQL's CREATE INDEX
    CONCURRENTLY, outside a transaction): the allocation table keeps all its history.
    """

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        model = to_state.apps.get_model(app_label, self.model_name)
        if not self.allow_migrate_model(schema_editor.connection.alias, model):
            return
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.add_index(model, self.index, concurrently=True)
        else:
            schema_editor.add_index(model, self.index)


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("provisioning", "0013_agentcommand_reset_gpu"),
    ]

    operations = [
        AddIndexConcurrentlyOnPostgreSQL(
            model_name="allocation",
            index=models.Index(fields=["ends_at"], name="allocation_end_idx"),
        ),
    ]
