"""
The restore drill: a small world is backed up (``manage.py backup``), restored into a fresh
database (``manage.py restore``) and checked there -- its audit chain against the published head,
every secret against the restored key ring, one scheduler cycle placing the queued reservation
with nothing double-booked -- and the backups that must not be restored are refused: a tampered
dump, a wrong passphrase, a database that is not empty, a rewritten manifest. Restored without its
key ring, a backup names the rows it cannot decrypt.

The backups dump the test database, so the tests commit their data (transaction=True).
"""

import json
import shutil
import uuid
from datetime import timedelta
from io import StringIO
from pathlib import Path

import psycopg
import pytest
from cryptography.fernet import Fernet
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from cloud.models import Node
from operations.backup_files import sha256
from operations.backup_restore import restore_backup
from operations.node_api.agents import credential_issue
from provisioning.models import Reservation
from provisioning.scheduling.scheduler import run_cycle
from security.audit_chain import audit_seal
from security.audit_heads import head_file
from tests.world import build_world, h100, small_fleet, vm_offering

pytestmark = [pytest.mark.django_db(transaction=True)]

PASSPHRASE = "drill passphrase, kept apart"


@pytest.fixture(autouse=True)
def passphrase(monkeypatch):
    monkeypatch.setenv("MERIDIAN_BACKUP_PASSPHRASE", PASSPHRASE)


def database_url(name: str) -> str:
    s = connection.settings_dict
    password = f":{s['PASSWORD']}" if s.get("PASSWORD") else ""
    return f"postgres://{s['USER']}{password}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{name}"


@pytest.fixture
def fresh_database():
    """``make()`` creates an empty database of a unique name; every one made is dropped afterwards."""
    made = []

    def make() -> str:
        name = f"{connection.settings_dict['NAME']}_restore_{uuid.uuid4().hex[:8]}"
        with connection.cursor() as cursor:
            cursor.execute(f'CREATE DATABASE "{name}"')
        made.append(name)
        return name

    yield make
    for name in made:
        with connection.cursor() as cursor:
            cursor.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def backup(tmp_path: Path, *options: str) -> Path:
    out = StringIO()
    call_command("backup", "--to", str(tmp_path / "backups"), *options, stdout=out)
    made = Path(out.getvalue().strip().splitlines()[-1])
    assert made.is_dir() and made.parent == tmp_path / "backups", out.getvalue()
    return made


def queued_reservation(world) -> Reservation:
    return Reservation.objects.create(
        tenant=world.t1.tenant, name=f"drill-{uuid.uuid4().hex[:6]}", offering=vm_offering(), gpu_model=h100(),
        units=1, gpus=1, regions=["us-east-1"], duration=timedelta(hours=1), state="queued")


def read_one(name: str, sql: str, params=()):
    s = connection.settings_dict
    with psycopg.connect(host=s["HOST"] or "127.0.0.1", port=s["PORT"] or 5432, user=s["USER"],
                         password=s.get("PASSWORD") or None, dbname=name) as conn:
        return conn.execute(sql, params).fetchone()


@pytest.fixture
def drill_world():
    """Two tenants, a fleet with BMC passwords, agents with keys, work placed and work queued, a sealed chain."""
    world = build_world()
    nodes = small_fleet(4)
    for node in nodes[:2]:
        credential_issue(actor=None, node=node)
    Reservation.objects.filter(state="queued").exclude(pk__in=[world.t1.objects[Reservation].pk,
                                                             world.t2.objects[Reservation].pk]).delete()
    assert run_cycle().placed == 2  # the world's two queued reservations, placed
    waiting = queued_reservation(world)
    while audit_seal():
        pass
    assert head_file().exists()  # the seal's head, published outside the database
    return world, waiting


def test_a_backup_restores_into_a_fresh_database_that_passes_every_check(drill_world, tmp_path, fresh_database):
    world, waiting = drill_world
    made = backup(tmp_path)
    manifest = json.loads((made / "manifest.json").read_text())
    assert manifest["engine"] == "postgresql" and manifest["database"] == connection.settings_dict["NAME"]
    assert manifest["audit_chain"]["seq"] > 0 and manifest["audit_heads"]["heads"] >= 1
    assert manifest["migrations_head"]["provisioning"] and manifest["pg_dump_version"].startswith("pg_dump")
    assert {"database.dump", "keys.enc"} <= set(manifest["files"])
    assert all(entry["sha256"] == sha256(made / name) for name, entry in manifest["files"].items())
    # No secret in the clear beside the dump: neither the key ring nor the secret key.
    for path in made.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert settings.MERIDIAN_ENCRYPTION_KEYS[0].encode() not in data
            assert settings.SECRET_KEY.encode() not in data

    target, lines = fresh_database(), []
    try:
        restored = restore_backup(source=made, database_url=database_url(target), passphrase=PASSPHRASE,
                                  say=lines.append)
    finally:
        print("\n".join(lines))  # shown when the test fails

    check = restored.check
    assert check["ok"], "\n".join(lines)
    assert check["audit"]["ok"] and check["audit"]["published_head"] == manifest["audit_chain"]["seq"]
    assert check["audit"]["events"] == manifest["audit_chain"]["seq"]
    assert check["secrets"]["cloud.Node.bmc_password"]["checked"] == Node.objects.count() >= 4
    assert check["secrets"]["provisioning.NodeCredential.secret"]["checked"] == 2
    assert check["secrets"]["security.ReceiptKey.private_key_pem"]["checked"] == 1
    assert not check["secrets"]["undecryptable_rows"]
    assert check["allocations"]["overlapping"] == 0 and check["allocations"]["live"] == 2
    assert set(check["allocations"]["constraints"]) == {"allocation_no_overlap", "allocation_one_slice_class"}
    assert check["scheduler"] == {"queued": 1, "placed": 1, "conflicts": 0, "waiting": 0, "overlapping": 0,
                                  "rolled_back": True}
    assert any(line.startswith("files: ") for line in lines) and any("scheduler: one cycle" in line for line in lines)
    # The cycle was the check's: the restored database is left as the backup had it.
    assert read_one(target, "SELECT state FROM provisioning_reservation WHERE id = %s", [waiting.pk]) == ("queued",)

    with pytest.raises(CommandError, match="is not empty"):
        call_command("restore", "--from", str(made), "--database-url", database_url(target), stdout=StringIO())


def test_a_backup_that_must_not_be_restored_is_refused_before_anything_is(tmp_path, monkeypatch):
    """Refused before the target is connected to: a tampered dump, a rewritten manifest, a backup from a newer
    release, a wrong passphrase; and no backup is made without a passphrase to seal its keys with."""
    small_fleet(1)
    made = backup(tmp_path)
    nowhere = database_url(f"never_created_{uuid.uuid4().hex[:8]}")  # refused before it is connected to
    call_command("restore", "--from", str(made), "--verify-files", stdout=StringIO())

    tampered = tmp_path / "tampered"
    shutil.copytree(made, tampered)
    with (tampered / "database.dump").open("r+b") as dump:
        dump.seek(100)
        byte = dump.read(1)
        dump.seek(100)
        dump.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(CommandError, match=r"database\.dump does not match its sha256"):
        call_command("restore", "--from", str(tampered), "--database-url", nowhere, stdout=StringIO())

    # The manifest rewritten to the tampered dump's digest: the digests sealed with the keys say so.
    manifest = json.loads((tampered / "manifest.json").read_text())
    manifest["files"]["database.dump"]["sha256"] = sha256(tampered / "database.dump")
    (tampered / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CommandError, match="the backup was altered after it was made"):
        call_command("restore", "--from", str(tampered), "--database-url", nowhere, stdout=StringIO())

    newer = tmp_path / "newer"
    shutil.copytree(made, newer)
    manifest = json.loads((newer / "manifest.json").read_text())
    manifest["migrations"]["provisioning"].append("9999_from_a_later_release")
    (newer / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CommandError, match="from a newer release.*provisioning.9999_from_a_later_release"):
        call_command("restore", "--from", str(newer), "--database-url", nowhere, stdout=StringIO())

    monkeypatch.setenv("MERIDIAN_BACKUP_PASSPHRASE", "not the passphrase it was made with")
    with pytest.raises(CommandError, match="the passphrase does not open keys.enc"):
        call_command("restore", "--from", str(made), "--database-url", nowhere, stdout=StringIO())
    monkeypatch.delenv("MERIDIAN_BACKUP_PASSPHRASE")
    with pytest.raises(CommandError, match="MERIDIAN_BACKUP_PASSPHRASE"):
        call_command("backup", "--to", str(tmp_path / "more"), stdout=StringIO())


def test_restored_without_its_key_ring_the_rows_it_cannot_decrypt_are_named(tmp_path, fresh_database, monkeypatch):
    nodes = small_fleet(1)
    made = backup(tmp_path, "--without-keys")
    manifest = json.loads((made / "manifest.json").read_text())
    assert manifest["keys"] == {"included": False} and "keys.enc" not in manifest["files"]

    # The restoring deployment has another key ring: the backup's secrets are not its to read.
    monkeypatch.setenv("MERIDIAN_ENCRYPTION_KEYS", Fernet.generate_key().decode())
    out = StringIO()
    with pytest.raises(CommandError) as refused:
        call_command("restore", "--from", str(made), "--database-url", database_url(fresh_database()), stdout=out)
    message = str(refused.value)
    assert "did not pass its checks" in message and "cannot be decrypted" in message, out.getvalue()
    assert f"cloud.Node pk={nodes[0].pk} field=bmc_password" in message
    assert "secrets: " in out.getvalue() and "undecryptable" in out.getvalue()
