"""
The tamper-evident audit trail: a sealer chains the audit events and signs checkpoints.

Writers only append (security.audit, inside each service's transaction), so the audit never
serialises unrelated work. Every few seconds the sealer -- one at a time, by an advisory lock --
takes the committed events not sealed yet in the order they became visible (their commit order,
as near as a reader can see it) and gives each its place (``seal_seq``) and a keyed hash:
HMAC-SHA256(chain key, previous hash || canonical bytes of the event). It then signs a
checkpoint of the head (sequence and hash) with Meridian's receipt key.

``audit_verify`` recomputes the chain: an edited event breaks its own link, a deleted one leaves
a gap in the sequence, and deleting the newest sealed events (truncation) leaves the chain
shorter than the last checkpoint says. Checkpoint rows can be deleted with the events, so each
signed head is also published outside the database (security.audit_heads) and the chain is held
to those too. It names the first broken link and, for a truncation, the events missing.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from core.db import update_rows
from security.audit_heads import head_dir, publish_head, published_heads
from security.models import AuditCheckpoint, AuditEvent, ReceiptKey
from security.receipts import sign_bytes, verify_bytes

GENESIS = "0" * 64
SEAL_BATCH = 5_000
_LOCK = 0x6D_72_64_61  # "mrda": one sealer at a time


def chain_key() -> bytes:
    """The server secret the links are keyed with (derived from the secret key unless set)."""
    configured = getattr(settings, "MERIDIAN_AUDIT_CHAIN_KEY", "")
    return (configured or hashlib.sha256(b"meridian-audit-chain|" + settings.SECRET_KEY.encode()).hexdigest()).encode()


def canonical(event: AuditEvent) -> bytes:
    """What a link covers: every recorded field of the event, as sorted-key JSON."""
    return json.dumps({
        "public_id": str(event.public_id), "occurred_at": event.occurred_at.isoformat(),
        "actor_id": str(event.actor_id) if event.actor_id else None, "actor_email": event.actor_email,
        "token_id": str(event.token_id) if event.token_id else None,
        "tenant_id": str(event.tenant_id) if event.tenant_id else None, "action": event.action,
        "target_type": event.target_type, "target_id": event.target_id, "before": event.before,
        "after": event.after, "request_id": event.request_id,
    }, sort_keys=True, separators=(",", ":"), default=str).encode()


def link(previous: str, event: AuditEvent, key: bytes) -> str:
    return hmac.new(key, previous.encode() + b"|" + canonical(event), hashlib.sha256).hexdigest()


def checkpoint_bytes(seq: int, head_hash: str, signed_at) -> bytes:
    return f"meridian-audit-checkpoint|{seq}|{head_hash}|{signed_at.isoformat()}".encode()


@transaction.atomic
def audit_seal(*, limit: int = SEAL_BATCH) -> int:
    """Seal the visible unsealed events (up to ``limit``) and sign a checkpoint; returns how many."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [_LOCK])
            if not cursor.fetchone()[0]:
                return 0  # another sealer is at it
    last = AuditEvent.objects.filter(seal_seq__isnull=False).order_by("-seal_seq").only(
        "seal_seq", "chain_hash").first()
    seq, previous = (last.seal_seq, last.chain_hash) if last else (0, GENESIS)
    events = list(AuditEvent.objects.filter(seal_seq__isnull=True).order_by("id")[:limit])
    if not events:
        return 0
    key = chain_key()
    for event in events:
        seq += 1
        previous = link(previous, event, key)
        event.seal_seq, event.chain_hash = seq, previous
    update_rows(AuditEvent, events, ["seal_seq", "chain_hash"])
    signed_at = timezone.now()
    kid, signature = sign_bytes(checkpoint_bytes(seq, previous, signed_at))
    AuditCheckpoint.objects.create(seq=seq, head_hash=previous, signed_at=signed_at, kid=kid, signature=signature)
    # Published once committed: a head whose seal rolled back would vouch for events never sealed.
    head = {"seq": seq, "head_hash": previous, "signed_at": signed_at, "kid": kid, "signature": signature}
    transaction.on_commit(lambda: publish_head(**head))
    return len(events)


@dataclass
class ChainReport:
    ok: bool = True
    events_checked: int = 0
    unsealed: int = 0
    checkpoints_checked: int = 0
    first_broken: dict | None = None
    problems: list[str] = field(default_factory=list)
    # The newest head published outside the database that is Meridian's (agrees with the chain or
    # carries the sealer's signature), and the sealed events found missing: {first_seq, last_seq, count}.
    published_head: dict | None = None
    truncated: dict | None = None
    warnings: list[str] = field(default_factory=list)

    def broken(self, seq, public_id, reason: str) -> None:
        self.ok = False
        self.problems.append(reason)
        if self.first_broken is None:
            self.first_broken = {"seq": seq, "event": str(public_id) if public_id else None, "reason": reason}

    def missing(self, first: int, last: int) -> None:
        if self.truncated is None or last > self.truncated["last_seq"]:
            first = min(first, self.truncated["first_seq"]) if self.truncated else first
            self.truncated = {"first_seq": first, "last_seq": last, "count": last - first + 1}

    def as_dict(self) -> dict:
        return asdict(self)


def audit_verify(*, batch: int = 2_000, published: Iterable[Path] = (), folder: Path | None = None) -> ChainReport:
    """
    Recompute the chain and check every checkpoint, and the heads published outside the database
    (``folder``, default the configured one, and ``published``, more files or folders), against it;
    name the first broken link.
    """
    report = ChainReport()
    key = chain_key()
    heads: dict[int, str] = {}
    expected, previous = 1, GENESIS
    rows = AuditEvent.objects.filter(seal_seq__isnull=False).order_by("seal_seq")
    for event in rows.iterator(chunk_size=batch):
        if event.seal_seq != expected:
            report.broken(expected, None, f"events {expected} to {event.seal_seq - 1} of the chain are missing "
                                          "(deleted)")
            previous = event.chain_hash  # go on from what is there, to find later breaks too
        elif link(previous, event, key) != event.chain_hash:
            report.broken(event.seal_seq, event.public_id, f"event {event.seal_seq} ({event.action} on "
                                                           f"{event.target_type}) was changed after it was sealed")
            previous = event.chain_hash
        else:
            previous = event.chain_hash
        heads[event.seal_seq] = event.chain_hash
        expected = event.seal_seq + 1
        report.events_checked += 1
    last_seq = expected - 1
    beyond = 0  # the newest checkpoint past the end of the chain
    for checkpoint in AuditCheckpoint.objects.order_by("seq"):
        report.checkpoints_checked += 1
        data = checkpoint_bytes(checkpoint.seq, checkpoint.head_hash, checkpoint.signed_at)
        if not verify_bytes(data, kid=checkpoint.kid, signature=checkpoint.signature):
            report.broken(checkpoint.seq, None, f"the checkpoint at {checkpoint.seq} has a bad signature")
        elif checkpoint.seq > last_seq:
            beyond = checkpoint.seq
        elif heads.get(checkpoint.seq) != checkpoint.head_hash:
            report.broken(checkpoint.seq, None, f"the chain at {checkpoint.seq} does not match its checkpoint")
    if beyond:
        report.missing(last_seq + 1, beyond)
        report.broken(last_seq + 1, None, f"events {last_seq + 1} to {beyond} were removed (truncated): the chain "
                                          f"ends at {last_seq} but a checkpoint vouches for {beyond}")
    _check_published(report, heads, last_seq, published, folder)
    report.unsealed = AuditEvent.objects.filter(seal_seq__isnull=True).count()
    return report


def _check_published(report: ChainReport, heads: dict[int, str], last_seq: int, paths: Iterable[Path],
                     folder: Path | None = None) -> None:
    """Hold the chain to the heads published outside the database (security.audit_heads)."""
    published, unreadable = published_heads(paths, folder=folder)
    report.warnings.extend(unreadable)
    agreed, vouched = [], []
    for head in published:
        if heads.get(head.seq) == head.head_hash:
            agreed.append(head)  # the chain's own keyed links vouch for it
        elif verify_bytes(checkpoint_bytes(head.seq, head.head_hash, head.signed_at), kid=head.kid,
                          signature=head.signature):
            vouched.append(head)  # Meridian signed it, and the chain no longer holds it
        elif not ReceiptKey.objects.filter(kid=head.kid).exists():
            report.broken(head.seq, None, f"the head published for event {head.seq} ({head.source}) was signed "
                                          f"with key {head.kid}, which is gone from the database")
        else:
            report.broken(head.seq, None, f"the head published for event {head.seq} ({head.source}) has a bad "
                                          "signature: it was not written by Meridian's sealer")
    genuine = agreed + vouched
    if genuine:
        report.published_head = max(genuine, key=lambda h: h.seq).as_dict()
    elif report.checkpoints_checked:
        report.warnings.append(f"no published head in {head_dir()}: a truncation that also deletes the "
                               "checkpoints would go unseen (keep that folder, see the README)")
    if not vouched:
        return
    newest = max(vouched, key=lambda h: h.seq)
    replaced = [h for h in vouched if h.seq <= last_seq]
    if not replaced:
        report.missing(last_seq + 1, newest.seq)
        report.broken(last_seq + 1, None, f"events {last_seq + 1} to {newest.seq} were removed (truncated) with "
                                          f"their checkpoints: the chain ends at {last_seq} but the head published "
                                          f"at {newest.signed_at.isoformat()} vouches for {newest.seq}")
        return
    oldest = min(h.seq for h in replaced)
    kept = max((h.seq for h in agreed if h.seq < oldest), default=0)
    report.missing(kept + 1, newest.seq)
    report.broken(oldest, None, f"the chain no longer matches the heads published for events {oldest} to "
                                f"{newest.seq}: events from {kept + 1} to {newest.seq} were removed (truncated) or "
                                f"replaced and sealed over again (the newest published head it still matches is "
                                f"{kept})")
