"""
Operations the provisioning migrations share (Django's migration loader skips modules whose
names start with "_"): PostgreSQL-only SQL, and an index built concurrently where it can be.
"""

from django.db import migrations


class PostgreSQLOnly(migrations.RunSQL):
    """SQL that runs on PostgreSQL only (SQLite, the embedded default, checks the rule in code)."""

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor == "postgresql":
            super().database_forwards(app_label, schema_editor, from_state, to_state)

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor == "postgresql":
            super().database_backwards(app_label, schema_editor, from_state, to_state)


class AddIndexConcurrentlyOnPostgreSQL(migrations.AddIndex):
    """Built without blocking writes where the database can (PostgreSQL, in a non-atomic migration)."""

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        model = to_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            schema_editor.add_index(model, self.index, **(
                {"concurrently": True} if schema_editor.connection.vendor == "postgresql" else {}))
