"""
``manage.py restore --check``: whether a restored database is one Meridian can run on.

Run against the database this process is configured with, with the key ring it is configured
with, and held to the audit heads published when the backup was made:

- the audit chain verifies against its published head (security.audit_chain.audit_verify), and
  holds the head the manifest recorded at backup time;
- every encrypted secret decrypts with the key ring (rotate_encryption_keys' own scan, counting
  only), and the rows that do not are named -- never their values;
- no two live allocations overlap (the exclusion constraints are there, and a query says so);
- the scheduler resumes: one cycle places queued work, with nothing double-booked. The cycle is
  rolled back, and runs with a cache of its own: the restored database stays as restored, the
  start messages are never sent and a live deployment's cache is not written.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from django.db import connection, transaction
from django.test.utils import override_settings

from provisioning.choices import ReservationState
from provisioning.models import Allocation, Reservation
from provisioning.scheduling.scheduler import run_cycle
from security.audit_chain import audit_verify
from security.audit_heads import head_dir, published_heads
from security.crypto import encrypted_fields
from security.management.commands.rotate_encryption_keys import Tally, rotate_field
from security.models import AuditEvent

MAX_LISTED = 20
# The allocation table's exclusion constraints (provisioning migrations 0014 and 0028).
EXCLUSION_CONSTRAINTS = {"allocation_no_overlap", "allocation_one_slice_class"}
_LOCAL_CACHE = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache",
                            "LOCATION": "meridian-restore-check"}}


@dataclass
class CheckReport:
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    audit: dict = field(default_factory=dict)
    secrets: dict = field(default_factory=dict)
    allocations: dict = field(default_factory=dict)
    scheduler: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict:
        return {**asdict(self), "ok": self.ok}


def restore_check(*, heads: Path, manifest: dict | None = None, say=lambda line: None) -> CheckReport:
    """Run every check (each one whatever the others found) and report what each found."""
    report = CheckReport()
    for check in (_check_audit, _check_secrets, _check_allocations, _check_scheduler):
        try:
            check(report, heads, manifest, say)
        except Exception as exc:  # one failing check must not hide what the others find
            report.problems.append(f"{check.__name__.removeprefix('_check_')}: the check failed: {exc}")
            say(f"{check.__name__.removeprefix('_check_')}: FAILED: {exc}")
    say("check: " + ("passed" if report.ok else f"{len(report.problems)} problem(s)"))
    return report


def _check_audit(report: CheckReport, heads: Path, manifest: dict | None, say) -> None:
    # Held to the heads of the backup only: heads published since (a live folder) vouch for later events.
    live = published_heads()[0]
    chain = audit_verify(folder=heads)
    head = chain.published_head
    report.audit = {"events": chain.events_checked, "checkpoints": chain.checkpoints_checked,
                    "unsealed": chain.unsealed, "published_head": head["seq"] if head else None, "ok": chain.ok}
    report.warnings.extend(chain.warnings)
    if not chain.ok:
        report.problems.append(f"audit: the chain does not verify: {chain.first_broken['reason']}")
    expected = (manifest or {}).get("audit_chain") or {}
    if expected.get("seq"):
        at = AuditEvent.objects.filter(seal_seq=expected["seq"]).values_list("chain_hash", flat=True).first()
        if at != expected["head_hash"]:
            report.problems.append(f"audit: the chain does not hold the head the manifest recorded (event "
                                   f"{expected['seq']}): this database is not the one the backup dumped")
    last = chain.events_checked
    later = [h for h in live if h.seq > last]
    if later and Path(heads).resolve() != head_dir().resolve():
        report.warnings.append(f"audit: heads published in {head_dir()} vouch for events up to "
                               f"{max(h.seq for h in later)}, past the {last} this database holds: those events were "
                               "sealed after the backup (or recovery point) and are not in it; move that folder's "
                               "files aside as the record of what was lost before the sealer runs again "
                               "(docs/backup.md)")
    say(f"audit: {chain.events_checked} sealed events and {chain.checkpoints_checked} checkpoints "
        + ("verify" if chain.ok else "do NOT verify")
        + (f" against the published head at {head['seq']}" if head else " (no published head)"))


def _check_secrets(report: CheckReport, heads: Path, manifest: dict | None, say) -> None:
    total = Tally()
    for model, model_field in encrypted_fields():
        tally = rotate_field(model, model_field, 500, dry_run=True)
        total.add(tally)
        report.secrets[f"{model._meta.label}.{model_field.name}"] = {
            "checked": tally.checked, "empty": tally.empty, "undecryptable": len(tally.undecryptable)}
    failed = total.undecryptable
    report.secrets["undecryptable_rows"] = failed[:MAX_LISTED]
    if failed:
        listed = "; ".join(failed[:MAX_LISTED]) + (f"; and {len(failed) - MAX_LISTED} more"
                                                     if len(failed) > MAX_LISTED else "")
        report.problems.append(f"secrets: {len(failed)} stored secret(s) cannot be decrypted with "
                               f"MERIDIAN_ENCRYPTION_KEYS (restore the backup's key ring): {listed}")
    say(f"secrets: {total.checked - total.empty} stored secret(s) in {len(encrypted_fields())} field(s), "
        f"{len(failed)} undecryptable")


def overlapping_allocations(limit: int = MAX_LISTED) -> list[tuple]:
    """Pairs of live allocations that share a GPU's memory at the same time, or a GPU across slice classes."""
    table = connection.ops.quote_name(Allocation._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT a.id, b.id, a.gpu_id FROM {table} a JOIN {table} b "  # noqa: S608
            "ON a.gpu_id = b.gpu_id AND a.id < b.id AND a.starts_at < b.ends_at AND b.starts_at < a.ends_at "
            "WHERE NOT a.archived AND NOT b.archived AND ((a.mem_lo < b.mem_hi AND b.mem_lo < a.mem_hi) "
            "OR (a.share_class <> '' AND b.share_class <> '' AND a.share_class <> b.share_class)) "
            f"LIMIT {int(limit)}")
        return cursor.fetchall()


def _check_allocations(report: CheckReport, heads: Path, manifest: dict | None, say) -> None:
    pairs = overlapping_allocations()
    report.allocations = {"live": Allocation.objects.filter(archived=False).count(), "overlapping": len(pairs)}
    if pairs:
        report.problems.append("allocations: double-booked GPUs: " + "; ".join(
            f"allocations {a} and {b} on GPU {gpu}" for a, b, gpu in pairs))
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT conname FROM pg_constraint WHERE conrelid = %s::regclass AND contype = 'x'",
                           [Allocation._meta.db_table])
            present = {row[0] for row in cursor.fetchall()}
        report.allocations["constraints"] = sorted(present)
        if missing := EXCLUSION_CONSTRAINTS - present:
            report.problems.append(f"allocations: the exclusion constraint(s) {', '.join(sorted(missing))} were not "
                                   "restored: the database would accept double bookings")
    say(f"allocations: {report.allocations['live']} live, {len(pairs)} overlapping"
        + (f", constraints {', '.join(sorted(report.allocations['constraints']))}"
           if "constraints" in report.allocations else ""))


def _check_scheduler(report: CheckReport, heads: Path, manifest: dict | None, say) -> None:
    with override_settings(CACHES=_LOCAL_CACHE), transaction.atomic():
        queued = Reservation.objects.filter(state=ReservationState.QUEUED).count()
        cycle = run_cycle()
        pairs = overlapping_allocations()
        transaction.set_rollback(True)
    report.scheduler = {"queued": queued, "placed": cycle.placed, "conflicts": cycle.conflicts,
                        "waiting": cycle.waiting, "overlapping": len(pairs), "rolled_back": True}
    if pairs:
        report.problems.append(f"scheduler: a cycle double-booked {len(pairs)} pair(s) of allocations")
    if queued and not cycle.placed:
        report.warnings.append(f"scheduler: one cycle placed none of {queued} queued reservation(s) (a full fleet "
                               "would do that too: see their waiting reasons in the console)")
    say(f"scheduler: one cycle placed {cycle.placed} of {queued} queued reservation(s), {cycle.conflicts} "
        f"conflict(s), {len(pairs)} double-booked (rolled back: the database stays as restored)")
