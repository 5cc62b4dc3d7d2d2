"""docs/releases.md states, for every migration after the first release, whether it upgrades without downtime."""

import re
from pathlib import Path

from django.db import migrations, models
from django.db.migrations.loader import MigrationLoader
from django.db.models.fields import NOT_PROVIDED

REPO = Path(__file__).resolve().parent.parent
RELEASES = REPO / "docs" / "releases.md"
PROJECT_APPS = {path.parent.name for path in REPO.glob("*/migrations")}
# Operations that break the previous release's code while it still runs against the new schema.
BREAKING = (migrations.RemoveField, migrations.RenameField, migrations.DeleteModel, migrations.RenameModel)


def first_release() -> dict[str, int]:
    text = RELEASES.read_text()
    line = re.search(r"Its migrations end at (.+?)\.\n", text, re.S).group(1)
    return {app: int(number) for app, number in re.findall(r"(\w+) (\d{4})", line.replace("\n", " "))}


def stated() -> dict[tuple[str, str], str]:
    rows = re.findall(r"^\| (\w+) \| (\d{4}_\w+) \| (yes|no) \|", RELEASES.read_text(), re.M)
    return {(app, name): verdict for app, name, verdict in rows}


def project_migrations():
    loader = MigrationLoader(None, ignore_no_migrations=True)
    for (app, name), migration in loader.disk_migrations.items():
        if app in PROJECT_APPS:  # the project's own, not Django's or a library's
            yield app, name, migration


def breaks_old_code(migration) -> bool:
    for operation in migration.operations:
        if isinstance(operation, BREAKING):
            return True
        if isinstance(operation, migrations.AlterField):
            field = operation.field
            if not field.null and not field.has_default() and field.db_default is NOT_PROVIDED:
                return True
    return False


def test_every_migration_after_the_first_release_is_stated_with_its_downtime():
    baseline, verdicts = first_release(), stated()
    later = [(app, name) for app, name, _ in project_migrations() if int(name[:4]) > baseline.get(app, 0)]
    missing = sorted(set(later) - set(verdicts))
    assert not missing, f"docs/releases.md does not state these migrations: {missing}"
    assert set(verdicts) <= set(later), "docs/releases.md lists a migration that does not exist or is older"


def test_a_migration_that_breaks_the_previous_code_is_not_called_zero_downtime():
    verdicts = stated()
    wrong = [(app, name) for app, name, migration in project_migrations()
             if verdicts.get((app, name)) == "yes" and breaks_old_code(migration)]
    assert not wrong, f"these remove, rename or require columns: not zero downtime: {wrong}"


def migration(*operations):
    return type("Migration", (migrations.Migration,), {"operations": list(operations)})("0099_change", "security")


def test_the_check_sees_a_breaking_operation():
    assert breaks_old_code(migration(migrations.RemoveField(model_name="incident", name="summary")))
    assert breaks_old_code(migration(migrations.AlterField(model_name="incident", name="kind",
                                                           field=models.CharField(max_length=64))))
    assert not breaks_old_code(migration(migrations.AddField(model_name="incident", name="note",
                                                             field=models.TextField(null=True))))
