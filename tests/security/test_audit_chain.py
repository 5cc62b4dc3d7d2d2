"""
The tamper-evident audit trail: sealed events form a keyed hash chain with signed checkpoints;
an edit, a deletion or a truncation is found and named; concurrent writers leave a valid chain.
"""

from __future__ import annotations

import threading

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connections, transaction

from security.audit import audit_record
from security.audit_chain import audit_seal, audit_verify
from security.models import AuditCheckpoint, AuditEvent
from tenants.models import Tenant


def write_events(n: int, start: int = 0) -> None:
    tenant = Tenant.objects.first() or Tenant.objects.create(name="Audited", slug="audited")
    for i in range(start, start + n):
        with transaction.atomic():
            audit_record(actor=None, action="test.change", target=tenant, after={"i": i})


@pytest.fixture
def heads(settings, tmp_path):
    """Where the signed heads are published: a folder the database's writer cannot reach."""
    settings.MERIDIAN_AUDIT_HEAD_DIR = str(tmp_path / "audit-heads")
    return tmp_path / "audit-heads"


def seal_and_publish(capture) -> int:
    """Seal as the task does: the head is published once the seal has committed."""
    with capture(execute=True):
        return audit_seal()


@pytest.fixture
def sealed(db, heads, django_capture_on_commit_callbacks):
    write_events(12)
    assert seal_and_publish(django_capture_on_commit_callbacks) == 12
    seal_and_publish(django_capture_on_commit_callbacks)  # the first checkpoint made the signing key, whose
    # creation is audited too
    assert not AuditEvent.objects.filter(seal_seq__isnull=True).exists()
    return list(AuditEvent.objects.order_by("seal_seq"))


def test_sealed_events_form_a_chain_that_verifies_with_its_checkpoint(sealed):
    report = audit_verify()
    checkpoints = AuditCheckpoint.objects.count()
    assert report.ok and report.events_checked == len(sealed) and report.checkpoints_checked == checkpoints
    assert [e.seal_seq for e in sealed] == list(range(1, len(sealed) + 1))
    assert len({e.chain_hash for e in sealed}) == len(sealed)
    write_events(3, start=100)
    assert audit_verify().unsealed == 3
    assert audit_seal() == 3 and audit_verify().ok and AuditCheckpoint.objects.count() == checkpoints + 1


def test_an_edited_event_is_named(sealed):
    target = sealed[5]
    AuditEvent.objects.filter(pk=target.pk).update(after={"i": 999})  # the trail edited behind the services' back
    report = audit_verify()
    assert not report.ok
    assert report.first_broken == {"seq": target.seal_seq, "event": str(target.public_id),
                                   "reason": f"event {target.seal_seq} (test.change on tenants.tenant) was changed "
                                             "after it was sealed"}


def test_a_deleted_event_leaves_a_named_gap(sealed):
    AuditEvent.objects.filter(pk=sealed[3].pk).delete()
    report = audit_verify()
    assert not report.ok and report.first_broken["seq"] == sealed[3].seal_seq
    assert "missing" in report.first_broken["reason"]


def test_truncating_the_newest_events_is_caught_by_the_checkpoint(sealed):
    AuditEvent.objects.filter(pk__in=[e.pk for e in sealed[-2:]]).delete()
    report = audit_verify()
    assert not report.ok and "truncated" in report.first_broken["reason"]
    assert report.first_broken["seq"] == sealed[-2].seal_seq


def test_truncation_with_its_checkpoints_is_caught_by_the_published_head(sealed, world, capsys):
    """The newest events and the checkpoints vouching for them, deleted together: the heads published
    outside the database still vouch for them."""
    gone = sealed[-2:]
    AuditEvent.objects.filter(pk__in=[e.pk for e in gone]).delete()
    AuditCheckpoint.objects.filter(seq__gte=gone[0].seal_seq).delete()
    report = audit_verify()
    first, last = gone[0].seal_seq, gone[-1].seal_seq
    assert not report.ok
    assert report.truncated == {"first_seq": first, "last_seq": last, "count": 2}
    assert report.first_broken["seq"] == first
    assert f"events {first} to {last}" in report.first_broken["reason"]
    assert "published" in report.first_broken["reason"] and "truncated" in report.first_broken["reason"]
    with pytest.raises(CommandError, match=f"events {first} to {last}"):
        call_command("audit_verify")
    body = world.client("platform_admin").get("/api/v1/audit-chain/").json()
    assert body["ok"] is False and body["truncated"] == {"first_seq": first, "last_seq": last, "count": 2}
    assert body["published_head"]["seq"] == last


def test_truncation_sealed_over_again_is_caught_by_the_published_heads(sealed, django_capture_on_commit_callbacks):
    """Deleting the newest events and checkpoints, then letting the sealer chain new events in their
    places: the database agrees with itself, but not with what was published before."""
    gone = sealed[-2:]
    AuditEvent.objects.filter(pk__in=[e.pk for e in gone]).delete()
    AuditCheckpoint.objects.filter(seq__gte=gone[0].seal_seq).delete()
    write_events(3, start=200)
    assert seal_and_publish(django_capture_on_commit_callbacks) == 3
    report = audit_verify()
    assert not report.ok
    assert "no longer match" in report.first_broken["reason"]
    assert report.truncated["last_seq"] == gone[-1].seal_seq


def test_each_seal_publishes_its_signed_head_outside_the_database(sealed, heads, caplog,
                                                                  django_capture_on_commit_callbacks):
    import json

    lines = [json.loads(line) for path in heads.glob("*.jsonl") for line in path.read_text().splitlines()]
    checkpoints = list(AuditCheckpoint.objects.order_by("seq"))
    assert [(h["seq"], h["head_hash"], h["signature"]) for h in sorted(lines, key=lambda h: h["seq"])] == [
        (c.seq, c.head_hash, c.signature) for c in checkpoints]
    write_events(1, start=300)
    with caplog.at_level("INFO", logger="meridian.audit.head"):
        seal_and_publish(django_capture_on_commit_callbacks)
    assert json.loads(caplog.records[-1].getMessage())["seq"] == checkpoints[-1].seq + 1
    report = audit_verify()
    assert report.ok and report.published_head["seq"] == checkpoints[-1].seq + 1


def test_a_forged_published_head_is_named(sealed, heads):
    import json

    path = next(heads.glob("*.jsonl"))
    last = json.loads(path.read_text().splitlines()[-1])
    with path.open("a") as published:
        published.write(json.dumps({**last, "seq": last["seq"] + 5}) + "\n")
    report = audit_verify()
    assert not report.ok and "bad signature" in report.first_broken["reason"]
    assert report.truncated is None


def test_a_published_head_whose_signing_key_was_deleted_is_named(sealed):
    from security.models import ReceiptKey

    gone = sealed[-1]
    AuditEvent.objects.filter(pk=gone.pk).delete()
    AuditCheckpoint.objects.filter(seq__gte=gone.seal_seq).delete()
    ReceiptKey.objects.all().delete()
    report = audit_verify()
    assert not report.ok
    assert any(f"event {gone.seal_seq}" in p and "gone from the database" in p for p in report.problems)


def test_without_published_heads_the_report_says_truncation_goes_unseen(db, heads):
    write_events(2)
    audit_seal()  # in the test's transaction: never committed, so never published
    report = audit_verify()
    assert report.ok and report.published_head is None
    assert any("no published head" in warning for warning in report.warnings)


def test_a_forged_checkpoint_or_rehashed_chain_is_caught(sealed):
    checkpoint = AuditCheckpoint.objects.order_by("seq").first()
    AuditCheckpoint.objects.filter(pk=checkpoint.pk).update(head_hash="f" * 64)
    assert "bad signature" in audit_verify().first_broken["reason"]


def test_the_command_and_the_staff_endpoint_report_it(sealed, world, capsys):
    call_command("audit_verify")
    assert "intact" in capsys.readouterr().out
    body = world.client("platform_admin").get("/api/v1/audit-chain/").json()
    assert body["ok"] is True and body["events_checked"] >= len(sealed)
    AuditEvent.objects.filter(pk=sealed[0].pk).update(action="test.other")
    with pytest.raises(CommandError, match="changed after it was sealed"):
        call_command("audit_verify")
    assert world.client("platform_admin").get("/api/v1/audit-chain/").json()["first_broken"]["seq"] == 1
    assert world.client("t1_owner").get("/api/v1/audit-chain/").status_code == 403


@pytest.mark.django_db(transaction=True)
def test_fifty_concurrent_writers_leave_a_valid_chain():
    Tenant.objects.create(name="Audited", slug="audited")
    errors = []

    def writer(i):
        try:
            write_events(4, start=i * 10)
        except Exception as exc:  # noqa: BLE001 -- reported below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(50)]
    for t in threads:
        t.start()
    sealer_runs = 0
    while any(t.is_alive() for t in threads):
        audit_seal()  # sealing while they write: the writers never wait for it
        sealer_runs += 1
    for t in threads:
        t.join()
    while audit_seal():
        pass
    assert not errors
    report = audit_verify()
    assert report.ok and report.unsealed == 0
    assert AuditEvent.objects.filter(action="test.change").count() == 200
    assert report.events_checked == AuditEvent.objects.count()
    connections.close_all()
