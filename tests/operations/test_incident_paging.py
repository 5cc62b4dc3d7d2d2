"""
Paging the on-call address (security.incident_paging): a real SMTP server (aiosmtpd) and a real
HTTP receiver on 127.0.0.1 take what a round sends; failures are retried with backoff, then given
up; a round killed between its claim and its mark sends again later, never loses an incident.
"""

from __future__ import annotations

import email
import hashlib
import hmac
import importlib
import json
import socket
import threading
from datetime import timedelta
from email import policy
from http.server import ThreadingHTTPServer

import pytest
from aiosmtpd.controller import Controller
from django.apps import apps
from django.utils import timezone

from operations.alerts import FLUCTUATION
from security import incident_paging
from security.incident_paging import page_round, severity_of
from security.incident_response import incident_assign
from security.models import Incident, IncidentNotice
from tenants.choices import PlatformRole
from tests.fake_http import VerbHandler
from tests.world import fleet_node, make_user, unique

pytestmark = pytest.mark.django_db
SECRET = "oncall-test-secret"
MIGRATION = "security.migrations.0008_incident_response_paging"


class Inbox:
    """The SMTP server's handler: every message it accepted, parsed."""

    def __init__(self):
        self.messages = []
        self.refuse = False

    async def handle_DATA(self, server, session, envelope):
        if self.refuse:
            return "451 Try again later"
        message = email.message_from_bytes(envelope.content, policy=policy.default)
        self.messages.append({"to": envelope.rcpt_tos, "subject": message["Subject"],
                              "body": message.get_body().get_content()})
        return "250 OK"


def free_port() -> int:
    with socket.socket() as probe:  # the controller checks its server by connecting, so port 0 will not do
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def smtp(settings):
    inbox = Inbox()
    controller = Controller(inbox, hostname="127.0.0.1", port=free_port())
    controller.start()
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", controller.port
    settings.EMAIL_TIMEOUT = 5
    yield inbox
    controller.stop()


class Receiver(VerbHandler):
    answers: list[int]
    received: list

    def _serve(self, method):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.received.append({"headers": dict(self.headers), "body": body})
        status = self.answers.pop(0) if self.answers else 200
        self.send_response(status)
        self.end_headers()
        self.wfile.write(b"ok" if status < 300 else b"receiver trouble")


@pytest.fixture
def hook(settings):
    handler = type("Handler", (Receiver,), {"answers": [], "received": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    settings.MERIDIAN_ONCALL_WEBHOOK_URL = f"http://127.0.0.1:{server.server_address[1]}/page"
    settings.MERIDIAN_ONCALL_WEBHOOK_SECRET = SECRET
    yield handler
    server.shutdown()
    server.server_close()


@pytest.fixture
def oncall(settings, smtp, hook):
    settings.MERIDIAN_ONCALL_EMAIL = ["oncall@meridian.example", "lead@meridian.example"]
    settings.MERIDIAN_PUBLIC_URL = "https://meridian.example"
    return smtp, hook


def incident(**fields) -> Incident:
    return Incident.objects.create(**{"kind": "node_failure", "summary": "A node stopped answering",
                                      "evidence": {"cause": "heartbeat_lost", "missed": 3}, **fields})


def later(minutes: float):
    return timezone.now() + timedelta(minutes=minutes)


def test_a_new_incident_is_mailed_and_posted_once_signed(world, oncall):
    inbox, hook = oncall
    node = fleet_node()
    made = incident(node_id=node.pk)

    assert page_round()["sent"] == 1
    assert page_round()["sent"] == 0  # marked: never again

    [mail] = inbox.messages
    assert sorted(mail["to"]) == ["lead@meridian.example", "oncall@meridian.example"]
    assert mail["subject"] == f"[Meridian CRITICAL] node_failure on {node.hostname} ({node.region.slug})"
    assert "A node stopped answering" in mail["body"] and '"missed": 3' in mail["body"]
    assert f"https://meridian.example/staff/incidents/{made.pk}/" in mail["body"]

    [post] = hook.received
    payload = json.loads(post["body"])
    assert payload["version"] == "4" and payload["status"] == "firing"
    [alert] = payload["alerts"]
    assert alert["labels"] == {"alertname": "node_failure", "severity": "critical", "incident_id": str(made.pk),
                               "node": node.hostname, "region": node.region.slug}
    assert payload["incident"]["evidence"] == {"cause": "heartbeat_lost", "missed": 3}
    assert post["headers"]["Meridian-Incident"] == str(made.pk)
    stamp, mac = (part.split("=", 1)[1] for part in post["headers"]["Meridian-Signature"].split(","))
    assert hmac.compare_digest(mac, hmac.new(SECRET.encode(), f"{stamp}.".encode() + post["body"],
                                             hashlib.sha256).hexdigest())
    made.refresh_from_db()
    assert made.notified_at and made.emailed_at and made.webhook_sent_at and made.notify_attempts == 1


def test_incidents_written_in_bulk_page_too(world, oncall):
    inbox, hook = oncall
    Incident.objects.bulk_create([Incident(kind="mass_silence", summary=f"region {i}", evidence={"region": "r"})
                                  for i in range(3)])
    assert page_round()["sent"] == 3
    assert len(inbox.messages) == 3 and len(hook.received) == 3
    assert all("(r)" in m["subject"] for m in inbox.messages)


def test_severity_decides_the_channels(world, oncall, settings):
    inbox, hook = oncall
    incident(kind=FLUCTUATION)  # informational: e-mail only
    isolation = incident(kind="isolation_foreign_process")  # any isolation violation is critical
    assert severity_of(FLUCTUATION) == "info" and severity_of(isolation.kind) == "critical"
    assert severity_of("something_new") == "warning"
    page_round()
    assert len(inbox.messages) == 2 and [json.loads(p["body"])["incident"]["id"] for p in hook.received] == [
        str(isolation.pk)]
    settings.MERIDIAN_ONCALL_MIN_SEVERITY = "warning"
    settings.MERIDIAN_ONCALL_SEVERITIES = {"node_drain": "info"}
    quiet = incident(kind="node_drain")
    assert page_round()["skipped"] == 1
    quiet.refresh_from_db()
    assert quiet.notified_at and not quiet.emailed_at and len(inbox.messages) == 2


def test_a_tenants_copy_never_pages(world, oncall):
    inbox, hook = oncall
    platform = incident()
    incident(tenant_id=world.t1.tenant.pk, evidence={"platform_incident": str(platform.pk)})
    counts = page_round()
    assert (counts["sent"], counts["skipped"]) == (1, 1)
    assert len(inbox.messages) == 1 and len(hook.received) == 1
    assert not Incident.objects.filter(notified_at__isnull=True).exists()


def test_nothing_configured_sends_nothing_and_does_not_page_the_past_later(world, settings, smtp):
    settings.MERIDIAN_ONCALL_EMAIL, settings.MERIDIAN_ONCALL_WEBHOOK_URL = [], ""
    old = incident()
    assert page_round()["skipped"] == 1
    settings.MERIDIAN_ONCALL_EMAIL = ["oncall@meridian.example"]
    assert page_round()["sent"] == 0 and smtp.messages == []
    old.refresh_from_db()
    assert old.notified_at is not None


def test_incidents_from_before_the_feature_do_not_page(world, oncall):
    """The migration marks every existing row notified, so deploying paging pages none of the past."""
    before = [incident(), incident(kind="gpu_failure")]
    importlib.import_module(MIGRATION).existing_incidents_were_seen(apps, None)
    assert all(Incident.objects.get(pk=i.pk).notified_at is not None for i in before)
    assert page_round()["sent"] == 0 and oncall[0].messages == []


def test_a_failed_send_is_retried_with_backoff_sending_only_what_failed(world, oncall, settings):
    inbox, hook = oncall
    hook.answers.extend([503])
    made = incident()
    assert page_round()["retrying"] == 1
    made.refresh_from_db()
    assert made.emailed_at and made.webhook_sent_at is None and made.notified_at is None
    assert made.notify_attempts == 1 and "webhook: HTTP 503" in made.notify_error
    first_try = made.notify_next_at
    assert timedelta(seconds=25) < first_try - timezone.now() <= timedelta(seconds=31)
    assert page_round()["retrying"] == 0 and len(hook.received) == 1  # not due yet

    assert page_round(now=later(1))["sent"] == 1
    made.refresh_from_db()
    assert made.notified_at and made.notify_error == "" and made.notify_attempts == 2
    assert len(inbox.messages) == 1 and len(hook.received) == 2  # the e-mail went once


def test_a_mail_server_that_refuses_is_tried_once_per_round_then_given_up(world, oncall, settings, caplog):
    inbox, hook = oncall
    settings.MERIDIAN_ONCALL_MAX_ATTEMPTS = 3
    inbox.refuse = True
    first, second = incident(), incident(kind="gpu_failure")
    rounds = [page_round(now=later(minutes)) for minutes in (0, 2, 10)]
    assert [r["retrying"] for r in rounds] == [2, 2, 0] and rounds[-1]["given_up"] == 2
    for made in (first, second):
        made.refresh_from_db()
        assert made.notified_at and made.emailed_at is None and made.notify_attempts == 3
        assert "e-mail" in made.notify_error
    assert "not tried" in second.notify_error or "not tried" in first.notify_error  # one try per round
    assert "Giving up paging incident" in caplog.text
    assert len(hook.received) == 2  # the webhook went through the first time, and only then


def test_a_round_killed_between_claim_and_mark_sends_again_after_the_lease(world, oncall, monkeypatch):
    inbox, hook = oncall
    made = incident()
    real = incident_paging.transaction.atomic
    calls = {"n": 0}

    def dies_at_the_mark(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:  # the first is the claim, the second the mark
            raise KeyboardInterrupt("worker killed")
        return real(*args, **kwargs)

    monkeypatch.setattr(incident_paging.transaction, "atomic", dies_at_the_mark)
    with pytest.raises(KeyboardInterrupt):
        page_round()
    monkeypatch.setattr(incident_paging.transaction, "atomic", real)
    made.refresh_from_db()
    assert made.notified_at is None and len(inbox.messages) == 1  # sent, not marked
    assert page_round()["sent"] == 0  # claimed: no second worker takes it while the lease lasts
    assert page_round(now=later(6))["sent"] == 1
    made.refresh_from_db()
    assert made.notified_at is not None
    assert len(inbox.messages) == 2 and len(hook.received) == 2  # at least once: sent again, never lost


def test_a_claim_rolled_back_leaves_the_incident_to_the_next_round(world, oncall, monkeypatch):
    made = incident()

    def broken(*args, **kwargs):
        raise RuntimeError("database went away")

    monkeypatch.setattr(incident_paging.Incident.objects, "select_for_update", broken)
    with pytest.raises(RuntimeError):
        page_round()
    monkeypatch.undo()
    made.refresh_from_db()
    assert made.notify_next_at is None and made.notified_at is None
    assert page_round()["sent"] == 1


def test_staff_notices_go_out_by_mail_in_the_round(world, smtp, settings):
    settings.MERIDIAN_ONCALL_EMAIL, settings.MERIDIAN_ONCALL_WEBHOOK_URL = [], ""
    other = make_user(f"{unique('oncall')}@meridian.example", platform_role=PlatformRole.ADMIN)
    made = incident()
    incident_assign(actor=world.users["platform_admin"], incident=made, assignee=other)
    smtp.refuse = True
    assert page_round()["notices_failed"] == 1
    smtp.refuse = False
    assert page_round(now=later(1))["notices_sent"] == 1
    [mail] = smtp.messages
    assert mail["to"] == [other.email] and "assigned to you by" in mail["subject"]
    notice = IncidentNotice.objects.get()
    assert notice.sent_at and notice.attempts == 2


def test_beat_runs_the_round_every_ten_seconds(world, oncall, settings):
    from security.tasks import incidents_page

    assert settings.CELERY_BEAT_SCHEDULE["security.incidents_page"]["task"] == "security.incidents_page"
    assert settings.CELERY_BEAT_SCHEDULE["security.incidents_page"]["schedule"] == 10.0
    incident()
    assert incidents_page()["sent"] == 1
