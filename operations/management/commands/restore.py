"""
``manage.py restore --from DIR --database-url URL``: a backup into a fresh database, then checked;
``manage.py restore --from DIR --check``: check the database this process runs on (docs/backup.md).
"""

import json
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from operations.backup import HEADS
from operations.backup_check import restore_check
from operations.backup_files import BackupError, passphrase_from, read_manifest
from operations.backup_restore import backup_open, restore_backup
from security.audit_heads import head_dir


class Command(BaseCommand):
    help = ("Restore a backup made by `manage.py backup` into a fresh, empty database (verifying every file's sha256 "
            "first), bring it to this release's migrations and check it: the audit chain against its published "
            "heads, every secret against the key ring, no double booking, one scheduler cycle.")

    def add_arguments(self, parser):
        parser.add_argument("--from", dest="source", metavar="DIR", help="The backup's folder.")
        parser.add_argument("--database-url", metavar="URL", help="The fresh database to restore into.")
        parser.add_argument("--force", action="store_true", help="Restore into a database that is not empty.")
        parser.add_argument("--keys-from", metavar="PATH", help="The sealed keys file, when kept apart (--keys-to).")
        parser.add_argument("--passphrase-file", metavar="PATH",
                            help="Read the passphrase from this file's first line (default: the environment's "
                                 "MERIDIAN_BACKUP_PASSPHRASE).")
        parser.add_argument("--write-env", metavar="PATH",
                            help="Write the backup's keys to this new file (mode 0600) as environment lines.")
        parser.add_argument("--no-check", action="store_true", help="Restore without checking the result.")
        parser.add_argument("--verify-files", action="store_true",
                            help="Only verify the backup: every sha256, and that the passphrase opens the keys.")
        parser.add_argument("--check", action="store_true",
                            help="Only check the database this process is configured with (DATABASE_URL) and its "
                                 "key ring, against the backup's manifest and published heads.")
        parser.add_argument("--heads", metavar="DIR",
                            help="With --check: the published heads to hold the chain to (default: the backup's "
                                 "copy, else MERIDIAN_AUDIT_HEAD_DIR), e.g. after a point-in-time recovery.")
        parser.add_argument("--json", action="store_true", help="With --check: end with the report as JSON.")

    def handle(self, *args, source, database_url, force, keys_from, passphrase_file, write_env, no_check,
               verify_files, check, heads, json, **options):
        if check:
            return self._check(Path(source) if source else None, Path(heads) if heads else None, json)
        if not source:
            raise CommandError("Pass --from: the backup's folder.")
        source = Path(source)
        try:
            passphrase = passphrase_from(passphrase_file)
            keys_path = Path(keys_from) if keys_from else None
            if verify_files:
                backup_open(source, passphrase=passphrase, keys_from=keys_path, say=self.stdout.write)
                self.stdout.write(self.style.SUCCESS("The backup is whole."))
                return
            if not database_url:
                raise CommandError("Pass --database-url: the fresh database to restore into.")
            restore_backup(source=source, database_url=database_url, passphrase=passphrase, keys_from=keys_path,
                           force=force, check=not no_check, write_env=Path(write_env) if write_env else None,
                           say=self.stdout.write)
        except BackupError as exc:
            raise CommandError(f"Restore refused: {exc}.") from exc
        self.stdout.write(self.style.SUCCESS("Restored" + ("." if no_check else " and checked.")))

    def _check(self, source: Path | None, heads: Path | None, as_json: bool):
        try:
            manifest = read_manifest(source) if source else None
        except BackupError as exc:
            raise CommandError(f"Check refused: {exc}.") from exc
        heads = heads or (source / HEADS if source else head_dir())
        report = restore_check(heads=heads, manifest=manifest, say=self.stdout.write)
        for warning in report.warnings:
            self.stdout.write(self.style.WARNING(f"warning: {warning}"))
        for problem in report.problems:
            self.stdout.write(self.style.ERROR(f"problem: {problem}"))
        if as_json:
            self.stdout.write(json.dumps(report.as_dict(), default=str))
        if not report.ok:
            raise CommandError(f"The restored database did not pass its checks ({len(report.problems)} problem(s)).")
