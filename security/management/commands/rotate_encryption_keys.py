"""
Re-encrypt every stored secret with the newest key: ``manage.py rotate_encryption_keys``.

Put the new key first in MERIDIAN_ENCRYPTION_KEYS, deploy, run this, then drop the old key. Rows
are walked in primary-key order, a batch at a time, each batch in its own short transaction, and
each row is written only if it still holds the ciphertext that was read, so the service keeps
running and a concurrent writer's newer value always wins. A run that stops half-way is simply run
again: rows already under the newest key are skipped. Neither plaintext nor ciphertext is printed.
"""

from dataclasses import dataclass, field, fields

from django.core.management.base import BaseCommand, CommandError
from django.db import models, transaction
from django.db.models import F, TextField, Value
from django.db.models.functions import Cast

from security.crypto import UndecryptableSecret, encrypted_fields, needs_rotation, reencrypt

MAX_LISTED_FAILURES = 20


@dataclass
class Tally:
    """What happened to the rows of one field (or of all of them, summed)."""

    checked: int = 0
    reencrypted: int = 0
    current: int = 0
    empty: int = 0
    raced: int = 0
    undecryptable: list = field(default_factory=list)

    def add(self, other: "Tally") -> None:
        for name in (f.name for f in fields(self)):
            setattr(self, name, getattr(self, name) + getattr(other, name))

    @property
    def skipped(self) -> int:
        return self.current + self.empty + self.raced


def _raw(model_field) -> Cast:
    """The stored column as plain text: the field's own from_db_value would decrypt it."""
    return Cast(F(model_field.attname), output_field=TextField())


def read_batch(model, model_field, after, size: int) -> list[tuple]:
    """The next ``size`` rows after primary key ``after``, as (pk, stored ciphertext)."""
    rows = model._base_manager.order_by("pk")
    if after is not None:
        rows = rows.filter(pk__gt=after)
    return list(rows.values_list("pk", _raw(model_field))[:size])


def write_if_unchanged(model, model_field, pk, old: str, new: str) -> bool:
    """
    Store ``new`` only where the row still holds ``old``; a value written since the batch was read
    is newer than ours and must stay. The value is an expression so the field does not encrypt it again.
    """
    updated = (
        model._base_manager.filter(pk=pk)
        .alias(stored=_raw(model_field))
        .filter(stored=old)
        .update(**{model_field.attname: Value(new, output_field=TextField())})
    )
    return updated == 1


def rotate_batch(model, model_field, rows: list[tuple], dry_run: bool = False) -> Tally:
    """Re-encrypt the rows of one batch that are not under the newest key, in one short transaction."""
    tally = Tally(checked=len(rows))
    with transaction.atomic():
        for pk, ciphertext in rows:
            _rotate_row(model, model_field, pk, ciphertext, dry_run, tally)
    return tally


def _rotate_row(model, model_field, pk, ciphertext, dry_run: bool, tally: Tally) -> None:
    if ciphertext in (None, ""):
        tally.empty += 1
        return
    if not needs_rotation(ciphertext):
        tally.current += 1
        return
    try:
        fresh = reencrypt(ciphertext)
    except UndecryptableSecret:
        tally.undecryptable.append(f"{model._meta.label} pk={pk} field={model_field.name}")
        return
    if dry_run or write_if_unchanged(model, model_field, pk, ciphertext, fresh):
        tally.reencrypted += 1
    else:
        tally.raced += 1


def rotate_field(model: type[models.Model], model_field, batch_size: int, dry_run: bool = False) -> Tally:
    """Walk one field's rows in primary-key order; rerunning after an interruption redoes no rows."""
    tally = Tally()
    after = None
    while rows := read_batch(model, model_field, after, batch_size):
        tally.add(rotate_batch(model, model_field, rows, dry_run))
        after = rows[-1][0]
    return tally


class Command(BaseCommand):
    help = (
        "Re-encrypt every secret stored with an older key in MERIDIAN_ENCRYPTION_KEYS with the newest one, "
        "in batches, without locking tables. Safe to interrupt and run again."
    )

    def add_arguments(self, parser):
        parser.add_argument("--batch-size", type=int, default=500, help="Rows per transaction (default 500).")
        parser.add_argument("--dry-run", action="store_true", help="Count what would be re-encrypted; write nothing.")

    def handle(self, *args, batch_size: int, dry_run: bool, **options):
        if batch_size < 1:
            raise CommandError("--batch-size must be at least 1.")
        total = Tally()
        for model, model_field in encrypted_fields():
            tally = rotate_field(model, model_field, batch_size, dry_run)
            self.stdout.write(f"{model._meta.label}.{model_field.name}: {self._describe(tally, dry_run)}")
            total.add(tally)
        self.stdout.write(f"Total: {self._describe(total, dry_run)}")
        if total.undecryptable:
            raise CommandError(self._failure(total.undecryptable))

    @staticmethod
    def _describe(tally: Tally, dry_run: bool) -> str:
        verb = "would re-encrypt" if dry_run else "re-encrypted"
        return (
            f"{tally.checked} checked, {tally.reencrypted} {verb}, {tally.skipped} skipped "
            f"({tally.current} already current, {tally.empty} empty, {tally.raced} changed meanwhile), "
            f"{len(tally.undecryptable)} undecryptable"
        )

    @staticmethod
    def _failure(rows: list[str]) -> str:
        listed = "\n".join(f"  {row}" for row in rows[:MAX_LISTED_FAILURES])
        more = len(rows) - MAX_LISTED_FAILURES
        tail = f"\n  ... and {more} more" if more > 0 else ""
        return (
            f"{len(rows)} stored secret(s) cannot be decrypted with any key in MERIDIAN_ENCRYPTION_KEYS "
            f"(the key that encrypted them is missing from the ring); put that key back and run again:\n{listed}{tail}"
        )
