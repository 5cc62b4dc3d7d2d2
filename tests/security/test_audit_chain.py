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
def sealed(db):
    write_events(12)
    assert audit_seal() == 12
    audit_seal()  # the first checkpoint made the signing key, whose creation is audited too
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
