"""
``manage.py restore``: a backup (operations.backup) into a fresh, empty database, then checked.

In order, stopping at the first thing wrong, before anything is written where it can be:
every file against its sha256; the keys opened with the passphrase, and the digests sealed with
them against the manifest's; the backup's migrations known to this release (a backup from a newer
release is refused); the target empty (unless ``force``). Then ``pg_restore --no-owner
--exit-on-error --single-transaction`` (all or nothing; embedded: SQLite's backup API), ``migrate``
for a backup from an older release, and ``restore --check`` (operations.backup_check) in a
process of its own whose database is the restored one and whose keys are the backup's -- the
same way a deployment reads them, from its environment.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

import environ
import psycopg
from django.conf import settings
from django.db.migrations.loader import MigrationLoader

from operations.backup import DUMP, SQLITE_COPY, libpq_environment, tool_version
from operations.backup_files import (
    KEYS_FILE,
    PASSPHRASE_ENV,
    BackupError,
    Keys,
    open_keys,
    private_file,
    read_manifest,
    sha256,
    verify_files,
    verify_sealed_digests,
)


@dataclass
class Restored:
    database: str
    keys: Keys | None
    migrated: bool = False
    check: dict | None = None


def backup_open(source: Path, *, passphrase: str | None, keys_from: Path | None = None,
                say=lambda line: None) -> tuple[dict, Keys | None]:
    """A backup's manifest and keys, once every file matches its digest and the passphrase opens the keys."""
    manifest = read_manifest(source)
    say(f"backup: {manifest['name']}, made {manifest['created_at']} by Meridian {manifest['meridian_version']} "
        f"({manifest['engine']} {manifest['database']})")
    verify_files(source, manifest, say)
    entry = manifest["keys"]
    if not entry["included"] and keys_from is None:
        say("keys: none in this backup (made --without-keys): this deployment's MERIDIAN_ENCRYPTION_KEYS and "
            "DJANGO_SECRET_KEY are used")
        return manifest, None
    path = keys_from or source / KEYS_FILE
    if not path.is_file():
        raise BackupError(f"the keys were stored apart from this backup as {entry.get('file')}: pass --keys-from "
                          "with that file")
    if entry.get("sha256") and sha256(path) != entry["sha256"]:
        raise BackupError(f"{path.name} is not this backup's keys file (its sha256 differs from the manifest's)")
    keys = open_keys(path, passphrase)
    if entry["included"]:  # (a keys file from another backup, for one made without: its digests are that one's)
        verify_sealed_digests(manifest, keys)
    say(f"keys: opened {path.name}: {len(keys.encryption_keys)} encryption key(s) and the secret key")
    return manifest, keys


def newer_migrations(manifest: dict) -> list[str]:
    """The backup's applied migrations this release does not have: it was made by a newer one."""
    loader = MigrationLoader(None, ignore_no_migrations=True)
    known = set(loader.disk_migrations)
    for migration in loader.disk_migrations.values():
        known.update(migration.replaces)  # squashed since: still this release's
    return [f"{app}.{name}" for app, names in manifest["migrations"].items() for name in names
            if (app, name) not in known]


def pending_migrations(manifest: dict) -> list[str]:
    """This release's migrations the backup had not applied: it was made by an older one."""
    applied = {(app, name) for app, names in manifest["migrations"].items() for name in names}
    graph = MigrationLoader(None, ignore_no_migrations=True).graph
    return [f"{app}.{name}" for app, name in graph.leaf_nodes() if (app, name) not in applied]


def restore_backup(*, source: Path, database_url: str, passphrase: str | None, keys_from: Path | None = None,
                   force: bool = False, check: bool = True, write_env: Path | None = None,
                   say=lambda line: None) -> Restored:
    """Restore ``source`` into the database at ``database_url``; raises BackupError on the first problem."""
    began = time.monotonic()
    manifest, keys = backup_open(source, passphrase=passphrase, keys_from=keys_from, say=say)
    if newer := newer_migrations(manifest):
        raise BackupError(f"the backup is from a newer release of Meridian ({manifest['meridian_version']}; "
                          f"migrations this release lacks: {', '.join(newer[:5])}): restore it with that release")
    target = environ.Env.db_url_config(database_url)
    engine = "sqlite" if target["ENGINE"].endswith("sqlite3") else "postgresql"
    if engine != manifest["engine"]:
        raise BackupError(f"a {manifest['engine']} backup cannot be restored into a {engine} database")
    if write_env and write_env.exists():
        raise BackupError(f"{write_env} exists already: name a new file for --write-env")
    if write_env and keys is None:
        raise BackupError("--write-env: this backup carries no keys (it was made --without-keys)")
    restored = Restored(database=target["NAME"], keys=keys)
    if engine == "postgresql":
        _restore_postgresql(source / DUMP, target, force, say)
    else:
        _restore_sqlite(source / SQLITE_COPY, Path(target["NAME"]), force, say)
    # The children read the restored database and the backup's keys as a deployment does: from the environment.
    env = {**{n: v for n, v in os.environ.items() if n != PASSPHRASE_ENV}, "DATABASE_URL": database_url,
           **(keys.environment() if keys else {})}
    if pending := pending_migrations(manifest):
        say(f"migrate: the backup is from an older release ({len(pending)} app(s) behind): applying this "
            "release's migrations")
        _manage(["migrate", "--no-input"], env, say)
        restored.migrated = True
    else:
        say("migrate: the backup is at this release's migrations; nothing to apply")
    if keys and keys.audit_chain_key and keys.audit_chain_key != getattr(settings, "MERIDIAN_AUDIT_CHAIN_KEY", ""):
        say("keys: the backup carries a MERIDIAN_AUDIT_CHAIN_KEY setting this deployment's settings lack: set it, "
            "or the restored audit chain will not verify")
    if write_env:
        _write_env(write_env, keys, say)
    if check:
        restored.check = _manage(["restore", "--check", "--from", str(source), "--json"], env, say, report=True)
    say(f"restore: {target['NAME']} restored in {time.monotonic() - began:.1f} s")
    if restored.check is not None and not restored.check["ok"]:
        raise BackupError("the restored database did not pass its checks: " + "; ".join(restored.check["problems"]))
    return restored


def _restore_postgresql(dump: Path, target: dict, force: bool, say) -> None:
    env = libpq_environment(target)
    tables = _postgresql_tables(target)
    if tables and not force:
        raise BackupError(f"the database {target['NAME']} is not empty ({tables} table(s)): restore into a fresh one "
                          "(createdb), or pass --force to replace what the backup holds in it")
    version = tool_version("pg_restore")
    say(f"database: restoring {dump.name} into {target['NAME']} with {version}"
        + (" (--force: replacing its objects)" if tables else ""))
    began = time.monotonic()
    command = ["pg_restore", "--no-owner", "--no-acl", "--exit-on-error", "--single-transaction",
               f"--dbname={target['NAME']}"] + (["--clean", "--if-exists"] if tables else []) + [str(dump)]
    run = subprocess.run(command, env=env, capture_output=True, text=True)  # noqa: S603
    if run.returncode:
        raise BackupError(f"pg_restore failed, nothing was restored (one transaction): {run.stderr.strip()[-2000:]}")
    say(f"database: restored in {time.monotonic() - began:.1f} s")


def _postgresql_tables(target: dict) -> int:
    """How many tables, views and sequences the target holds outside PostgreSQL's own schemas."""
    env = libpq_environment(target)
    params = {"host": env.get("PGHOST"), "port": env.get("PGPORT"), "user": env.get("PGUSER"),
              "password": env.get("PGPASSWORD"), "dbname": target["NAME"], "sslmode": env.get("PGSSLMODE")}
    try:
        with psycopg.connect(**{k: v for k, v in params.items() if v}) as conn, conn.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                           "WHERE n.nspname NOT IN ('pg_catalog', 'information_schema') "
                           "AND n.nspname !~ '^pg_' AND c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f')")
            return cursor.fetchone()[0]
    except psycopg.OperationalError as exc:
        raise BackupError(f"cannot connect to the database to restore into ({target['NAME']}): "
                          f"{str(exc).strip()} -- create it first (createdb) and check --database-url") from exc


def _restore_sqlite(copy: Path, target: Path, force: bool, say) -> None:
    if target.exists() and target.stat().st_size:
        with closing(sqlite3.connect(target)) as existing:
            tables = existing.execute("SELECT count(*) FROM sqlite_master WHERE type = 'table'").fetchone()[0]
        if tables and not force:
            raise BackupError(f"{target} is not empty ({tables} table(s)): name a new file, or pass --force to "
                              "replace it")
    target.parent.mkdir(parents=True, exist_ok=True)
    say(f"database: copying {copy.name} into {target} with SQLite's backup API")
    with closing(sqlite3.connect(copy)) as source, closing(sqlite3.connect(target)) as restored:
        source.backup(restored)


def _manage(arguments: list[str], env: dict, say, report: bool = False) -> dict | None:
    """Run ``manage.py`` on the restored database, relaying its lines; with ``report`` its last line is JSON."""
    command = [sys.executable, str(Path(settings.BASE_DIR) / "manage.py"), *arguments]
    child = subprocess.Popen(command, cwd=settings.BASE_DIR, env=env, stdout=subprocess.PIPE,  # noqa: S603
                             stderr=subprocess.STDOUT, text=True)
    last = None
    for line in child.stdout:
        line = line.rstrip("\n")
        if report and line.startswith('{"problems"'):
            last = line
        elif line.strip():
            say(f"  {line}")
    if child.wait() and not (report and last):
        raise BackupError(f"manage.py {' '.join(arguments[:2])} failed on the restored database (exit "
                          f"{child.returncode}): see the lines above")
    return json.loads(last) if report and last else None


def _write_env(path: Path, keys: Keys, say) -> None:
    lines = [f"{name}={value}" for name, value in keys.environment().items()]
    if keys.audit_chain_key:
        lines.append(f"MERIDIAN_AUDIT_CHAIN_KEY={keys.audit_chain_key}")
    private_file(path, ("\n".join(lines) + "\n").encode())
    say(f"keys: written to {path} (mode 0600) for the deployment's environment or secret store; delete it once "
        "stored there")
