"""``manage.py backup --to DIR``: the database, the published audit heads and the sealed keys (docs/backup.md)."""

from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from operations.backup import backup_create
from operations.backup_files import BackupError, passphrase_from
from operations.backup_restore import backup_open


class Command(BaseCommand):
    help = ("Back up the database (pg_dump, or SQLite's online backup in embedded mode), a copy of the published "
            "audit heads and the key ring sealed with MERIDIAN_BACKUP_PASSPHRASE into a new folder under --to.")

    def add_arguments(self, parser):
        parser.add_argument("--to", required=True, metavar="DIR", help="Where the backup's folder is made.")
        parser.add_argument("--keys-to", metavar="DIR",
                            help="Write the sealed keys file here instead of beside the dump (another store).")
        parser.add_argument("--without-keys", action="store_true",
                            help="Leave the keys out: a secret store keeps MERIDIAN_ENCRYPTION_KEYS and "
                                 "DJANGO_SECRET_KEY already.")
        parser.add_argument("--passphrase-file", metavar="PATH",
                            help="Read the passphrase from this file's first line (default: the environment's "
                                 "MERIDIAN_BACKUP_PASSPHRASE).")
        parser.add_argument("--verify", action="store_true",
                            help="Then read the backup back: every sha256, and the passphrase opens its keys.")

    def handle(self, *args, to, keys_to, without_keys, passphrase_file, verify, **options):
        try:
            passphrase = None if without_keys else passphrase_from(passphrase_file)
            made = backup_create(to=Path(to), keys_to=Path(keys_to) if keys_to else None, with_keys=not without_keys,
                                 passphrase=passphrase, say=self.stdout.write)
            if verify:
                backup_open(made.path, passphrase=passphrase, keys_from=made.keys_path, say=self.stdout.write)
        except BackupError as exc:
            raise CommandError(f"Backup failed: {exc}.") from exc
        self.stdout.write(self.style.SUCCESS(str(made.path)))
