"""
``manage.py backup``: one consistent backup of what a Meridian deployment cannot rebuild.

A backup is a folder ``meridian-<UTC time>`` holding

- ``database.dump``: ``pg_dump --format=custom`` of the database (embedded mode: ``database.sqlite3``,
  copied with SQLite's online backup API while Meridian runs);
- ``audit-heads/``: a copy of the published audit heads (MERIDIAN_AUDIT_HEAD_DIR), taken just before
  the database's snapshot, so every head in it is vouched for by a chain the dump holds;
- ``keys.enc``: the key ring, the secret key and the audit chain's key, sealed with the operator's
  passphrase (operations.backup_files), or written to another store (``--keys-to``), or left out
  when a secret store keeps them already (``--without-keys``);
- ``manifest.json``: when, from which release and migrations, the tools' versions, the audit
  chain's head in the dumped snapshot, and every file's sha256.

The folder is written as ``<name>.partial`` and renamed when complete: a backup cut short never
looks whole. The dump runs in a snapshot exported from a REPEATABLE READ transaction that also
reads the chain's head and the applied migrations, so the manifest describes exactly the dump.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import time
import tomllib
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

import psycopg
from django.conf import settings
from django.db import connection
from django.utils import timezone

from operations.backup_files import (
    FORMAT,
    KEYS_FILE,
    MANIFEST,
    MIN_PASSPHRASE,
    PASSPHRASE_ENV,
    BackupError,
    Keys,
    describe,
    private_file,
    seal_keys,
)
from security.audit_heads import head_dir
from security.models import AuditEvent

DUMP = "database.dump"
SQLITE_COPY = "database.sqlite3"
HEADS = "audit-heads"


@dataclass
class Backup:
    path: Path
    manifest: dict
    keys_path: Path | None


def backup_create(*, to: Path, passphrase: str | None, keys_to: Path | None = None, with_keys: bool = True,
                  say=lambda line: None) -> Backup:
    """Write a complete backup into a new folder under ``to``; ``say`` gets a line per step."""
    if with_keys and not passphrase:
        raise BackupError(f"set {PASSPHRASE_ENV} (or pass --passphrase-file) to seal the key ring for the operator, "
                          "or pass --without-keys if a secret store keeps MERIDIAN_ENCRYPTION_KEYS and "
                          "DJANGO_SECRET_KEY already")
    if with_keys and len(passphrase) < MIN_PASSPHRASE:
        raise BackupError(f"the backup passphrase must be at least {MIN_PASSPHRASE} characters long")
    began = time.monotonic()
    stamp = timezone.now()
    name = f"meridian-{stamp:%Y%m%dT%H%M%SZ}"
    to.mkdir(parents=True, exist_ok=True)
    final, partial = to / name, to / f"{name}.partial"
    if final.exists() or partial.exists():
        raise BackupError(f"{final} exists already: wait a second and run again")
    partial.mkdir(mode=0o700)
    keys_path = None
    try:
        heads = _copy_heads(partial / HEADS, say)
        if connection.vendor == "postgresql":
            database = _dump_postgresql(partial / DUMP, say)
        elif connection.vendor == "sqlite":
            database = _dump_sqlite(partial / SQLITE_COPY, say)
        else:
            raise BackupError(f"backing up a {connection.vendor} database is not supported")
        files = {str(path.relative_to(partial)): describe(path) for path in sorted(partial.rglob("*"))
                 if path.is_file()}
        keys = {"included": False}
        if with_keys:
            keys_path = keys_to / f"{name}.{KEYS_FILE}" if keys_to else partial / KEYS_FILE
            keys = {"included": True, "file": keys_path.name, "stored": "apart" if keys_to else "beside",
                    **_seal_keys_into(keys_path, files, passphrase)}
            if not keys_to:
                files[KEYS_FILE] = {"sha256": keys["sha256"], "bytes": keys["bytes"]}
            say(f"keys: the key ring ({len(settings.MERIDIAN_ENCRYPTION_KEYS)} key(s)) and the secret key sealed "
                f"with the passphrase into {keys_path if keys_to else final / KEYS_FILE}")
        else:
            say("keys: left out (--without-keys): keep MERIDIAN_ENCRYPTION_KEYS and DJANGO_SECRET_KEY in your "
                "secret store; without them the restored secrets and audit chain cannot be checked")
        manifest = {
            "format": FORMAT, "name": name, "created_at": stamp.isoformat(), "meridian_version": _version(),
            **database, "audit_heads": heads, "keys": keys, "files": files,
        }
        private_file(partial / MANIFEST, (_json(manifest) + "\n").encode())
        partial.rename(final)
        if keys_path is not None and not keys_to:
            keys_path = final / KEYS_FILE
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        if keys_path is not None and keys_to:
            keys_path.unlink(missing_ok=True)
        raise
    size = sum(f["bytes"] for f in files.values())
    say(f"backup: {final} complete, {len(files)} files, {size / 2**20:.1f} MiB in {time.monotonic() - began:.1f} s")
    return Backup(path=final, manifest=manifest, keys_path=keys_path)


def _seal_keys_into(path: Path, files: dict, passphrase: str) -> dict:
    """The key ring, the secret key and the chain's key sealed into ``path`` with the digests of ``files``."""
    keys = Keys(encryption_keys=list(settings.MERIDIAN_ENCRYPTION_KEYS), secret_key=settings.SECRET_KEY,
                audit_chain_key=getattr(settings, "MERIDIAN_AUDIT_CHAIN_KEY", "") or "",
                files={name: entry["sha256"] for name, entry in files.items()})
    path.parent.mkdir(parents=True, exist_ok=True)
    private_file(path, seal_keys(keys, passphrase))
    return describe(path)


def _copy_heads(target: Path, say) -> dict:
    """The published heads, copied before the snapshot: each one's seal has committed, so the dump holds it."""
    source = head_dir()
    target.mkdir()
    files = sorted(source.glob("*.jsonl")) if source.is_dir() else []
    lines = 0
    for path in files:
        shutil.copyfile(path, target / path.name)
        lines += sum(1 for line in (target / path.name).read_bytes().splitlines() if line.strip())
    if files:
        say(f"audit heads: {len(files)} file(s), {lines} published head(s) copied from {source}")
    else:
        say(f"audit heads: none published in {source} (audit_verify cannot see a truncation without them)")
    return {"source": str(source), "files": len(files), "heads": lines}


def libpq_environment(params: dict) -> dict[str, str]:
    """A Django database's connection settings as libpq's environment: the password never on a command line."""
    env = {name: value for name, value in os.environ.items() if name != PASSPHRASE_ENV}
    pairs = {"PGHOST": params.get("HOST"), "PGPORT": params.get("PORT"), "PGUSER": params.get("USER"),
             "PGPASSWORD": params.get("PASSWORD"), "PGDATABASE": params.get("NAME")}
    options = params.get("OPTIONS") or {}
    for option in ("sslmode", "sslrootcert", "sslcert", "sslkey"):
        pairs[f"PG{option.upper()}"] = options.get(option)
    env.update({name: str(value) for name, value in pairs.items() if value not in (None, "")})
    return env


def tool_version(tool: str) -> str:
    try:
        return subprocess.run([tool, "--version"], capture_output=True, text=True,  # noqa: S603
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError) as exc:
        raise BackupError(f"{tool} cannot be run ({exc}): install the PostgreSQL client tools of the server's major "
                          "version (or newer) and put them on PATH") from exc


def _dump_postgresql(path: Path, say) -> dict:
    version = tool_version("pg_dump")
    params = connection.settings_dict
    snapshot_holder = connection.get_new_connection(connection.get_connection_params())
    try:
        snapshot_holder.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        with snapshot_holder.cursor() as cursor:
            cursor.execute("SELECT pg_export_snapshot(), current_setting('server_version')")
            snapshot, server_version = cursor.fetchone()
            facts = _facts(cursor)
        say(f"database: dumping {params['NAME']} (PostgreSQL {server_version}) with {version}, snapshot {snapshot}")
        began = time.monotonic()
        run = subprocess.run(["pg_dump", "--format=custom", "--no-password", f"--snapshot={snapshot}",  # noqa: S603, S607
                              f"--file={path}"], env=libpq_environment(params), capture_output=True, text=True)
        if run.returncode:
            raise BackupError(f"pg_dump failed: {run.stderr.strip()[-2000:]}")
    finally:
        snapshot_holder.close()
    say(f"database: {path.name} {path.stat().st_size / 2**20:.1f} MiB in {time.monotonic() - began:.1f} s")
    return {"engine": "postgresql", "database": params["NAME"], "server_version": server_version,
            "pg_dump_version": version, **facts}


def _dump_sqlite(path: Path, say) -> dict:
    source = connection.settings_dict["NAME"]
    say(f"database: copying {source} with SQLite's online backup API")
    began = time.monotonic()
    with closing(sqlite3.connect(source)) as live, closing(sqlite3.connect(path)) as copy:
        live.backup(copy, pages=4096)
        copy.execute("PRAGMA journal_mode=DELETE")  # one self-contained file, no -wal beside it
        facts = _facts(copy.cursor())
    say(f"database: {path.name} {path.stat().st_size / 2**20:.1f} MiB in {time.monotonic() - began:.1f} s")
    return {"engine": "sqlite", "database": str(source), "sqlite_version": sqlite3.sqlite_version, **facts}


def _facts(cursor) -> dict:
    """What the manifest says of the database, read in the dumped snapshot: the chain's head, the migrations."""
    table = connection.ops.quote_name(AuditEvent._meta.db_table)
    cursor.execute(f"SELECT seal_seq, chain_hash FROM {table} WHERE seal_seq IS NOT NULL "  # noqa: S608
                   "ORDER BY seal_seq DESC LIMIT 1")
    head = cursor.fetchone()
    cursor.execute(f"SELECT count(*) FROM {table} WHERE seal_seq IS NULL")  # noqa: S608
    unsealed = cursor.fetchone()[0]
    cursor.execute("SELECT app, name FROM django_migrations ORDER BY app, id")
    migrations: dict[str, list[str]] = {}
    for app, name in cursor.fetchall():
        migrations.setdefault(app, []).append(name)
    return {
        "audit_chain": {"seq": head[0] if head else 0, "head_hash": head[1] if head else None, "unsealed": unsealed},
        "migrations_head": {app: max(names) for app, names in migrations.items()},
        "migrations": migrations,
    }


def _version() -> str:
    with (Path(settings.BASE_DIR) / "pyproject.toml").open("rb") as stream:
        return tomllib.load(stream)["project"]["version"]


def _json(value) -> str:
    return json.dumps(value, indent=2, sort_keys=True)
