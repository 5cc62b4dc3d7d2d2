"""
Paging the on-call address about new incidents (docs/incidents.md, "Paging"), and telling staff
of incidents handed to them.

Incidents are written in many places, some with ``bulk_create`` (no signal), so the incident row
is its own outbox: ``page_round`` (the ``security.incidents_page`` task, every few seconds) takes
the oldest incidents whose ``notified_at`` is empty and not waiting for a retry, sends each one
e-mail (to ``MERIDIAN_ONCALL_EMAIL``) and one webhook POST (``MERIDIAN_ONCALL_WEBHOOK_URL``),
then marks it.

- **Claim, send, mark.** The claim locks the rows (skip-locked: two workers never take the same
  incident) and writes a lease (``notify_next_at`` LEASE on) in a short transaction; the sends run
  outside any transaction, so no detector waits on a locked incident while a mail server answers;
  each incident is marked in its own short transaction after its sends. A worker killed between
  the claim and the mark leaves the incident unmarked: once the lease is over the next round sends
  it again. At least once: an incident is never lost, and may be sent twice (the webhook carries
  the incident id, ``Meridian-Incident``, for the receiver to drop the second).
- **Each channel once.** ``emailed_at`` and ``webhook_sent_at`` record what went out, so a retry
  sends only what failed.
- **Retries.** A failed send leaves the incident unmarked with ``notify_attempts`` + 1, the error,
  and its next try after 30 s, 1 min, 2 min ... (doubling, 1 h at most); after
  MERIDIAN_ONCALL_MAX_ATTEMPTS it is given up (marked, the error kept, an error logged). A
  channel that failed once in a round is not tried again in that round (a mail server that is
  down costs one timeout per round, not one per incident).
- **Who gets what.** Each kind has a severity (SEVERITY, overridden by MERIDIAN_ONCALL_SEVERITIES):
  e-mail at or above MERIDIAN_ONCALL_MIN_SEVERITY, the webhook at or above
  MERIDIAN_ONCALL_PAGE_SEVERITY. A tenant's copy of a platform incident (``evidence.platform_incident``)
  is never sent: the platform incident was. With neither address set, incidents are marked and
  nothing is sent, so configuring an address later does not page the past.

Staff notices (``IncidentNotice``, written by security.incident_response with the change) go out
in the same round, by e-mail, with the same claim, lease and retries.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import logging
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import requests
from django.conf import settings
from django.core.mail import EmailMessage, get_connection
from django.db import transaction
from django.db.models import Q
from django.urls import reverse
from django.utils import timezone

from cloud.models import Node
from security.models import Incident, IncidentNotice
from tenants.models import Tenant

log = logging.getLogger(__name__)

INFO, WARNING, CRITICAL = "info", "warning", "critical"
SEVERITIES = (INFO, WARNING, CRITICAL)  # lowest first
# Which incidents wake someone up. Critical: a tenant's work or the whole fleet is hit now, or a
# security boundary failed. Warning: something to look at today (often the forerunner of a
# critical one, which pages by itself). Info: trends.
SEVERITY = {
    "node_failure": CRITICAL,
    "gpu_failure": CRITICAL,
    "control_plane_stall": CRITICAL,
    "mass_silence": CRITICAL,
    "attestation_failed": CRITICAL,
    "node_suspect": WARNING,
    "gpu_reset": WARNING,
    "node_drain": WARNING,
    "repeated_xids_node": WARNING,
    "scrub_unverified": WARNING,
    "fabric_drift": WARNING,
    "reference_unavailable": WARNING,
    "attestation_not_capable": WARNING,
    "utilization_fluctuation": INFO,
}
CRITICAL_PREFIXES = ("isolation_",)  # a tenant's GPU reached by another process: one kind per violation
UNKNOWN_KIND = WARNING

BATCH = 50
LEASE = timedelta(minutes=5)  # a round's sends end well before this (ROUND_BUDGET_S)
ROUND_BUDGET_S = 60.0  # no new send starts after this; the rest waits for the next round
MAX_BACKOFF = timedelta(hours=1)
WEBHOOK_TIMEOUT_S = (3.05, 10)  # connect, read
EVIDENCE_CHARS = 4000
USER_AGENT = "Meridian-Oncall/1"


def severity_of(kind: str) -> str:
    chosen = settings.MERIDIAN_ONCALL_SEVERITIES.get(kind) or SEVERITY.get(kind)
    if chosen in SEVERITIES:
        return chosen
    return CRITICAL if kind.startswith(CRITICAL_PREFIXES) else UNKNOWN_KIND


def at_least(severity: str, minimum: str) -> bool:
    """Whether ``severity`` reaches ``minimum`` (an unknown minimum is the lowest: nothing is kept back)."""
    floor = SEVERITIES.index(minimum) if minimum in SEVERITIES else 0
    return SEVERITIES.index(severity) >= floor


def backoff(attempts: int) -> timedelta:
    """How long after its ``attempts``-th failed try an incident or notice is tried again."""
    return min(timedelta(seconds=settings.MERIDIAN_ONCALL_RETRY_SECONDS * 2 ** (attempts - 1)), MAX_BACKOFF)


def signature_header(secret: str, timestamp: int, body: bytes) -> str:
    """``t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">``, as webhook deliveries are signed."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={mac}"


def console_url(incident_id) -> str:
    return settings.MERIDIAN_PUBLIC_URL.rstrip("/") + reverse("staff-incident", args=[incident_id])


#
# What an incident says, for a person and for a pager
#


@dataclass
class Where:
    """The names an incident's plain ids stand for, read once per round."""
    nodes: dict = field(default_factory=dict)  # node id -> (hostname, region slug)
    tenants: dict = field(default_factory=dict)  # tenant id -> slug

    @classmethod
    def of(cls, incidents: list[Incident]) -> Where:
        node_ids = {i.node_id for i in incidents if i.node_id}
        tenant_ids = {i.tenant_id for i in incidents if i.tenant_id}
        return cls(
            nodes={pk: (host, region) for pk, host, region in
                   Node.objects.filter(pk__in=node_ids).values_list("pk", "hostname", "region__slug")},
            tenants=dict(Tenant.objects.filter(pk__in=tenant_ids).values_list("pk", "slug")))

    def node(self, incident: Incident) -> str:
        return self.nodes.get(incident.node_id, ("", ""))[0] if incident.node_id else ""

    def region(self, incident: Incident) -> str:
        return self.nodes.get(incident.node_id, ("", ""))[1] or str(incident.evidence.get("region") or "")


def email_message(incident: Incident, where: Where, severity: str) -> tuple[str, str]:
    """Subject and body of the on-call e-mail."""
    place = " ".join(filter(None, [where.node(incident), f"({where.region(incident)})" if where.region(incident)
                                   else ""])) or "the platform"
    state = " [resolved]" if incident.resolved_at else ""
    subject = f"[Meridian {severity.upper()}] {incident.kind} on {place}{state}"[:200]
    evidence = json.dumps(incident.evidence, indent=2, sort_keys=True, default=str)
    if len(evidence) > EVIDENCE_CHARS:
        evidence = evidence[:EVIDENCE_CHARS] + "\n... (cut short; the console shows all of it)"
    lines = [
        incident.summary,
        "",
        f"Kind:      {incident.kind} ({severity})",
        f"Detected:  {incident.detected_at:%Y-%m-%d %H:%M:%S} UTC",
        f"Node:      {where.node(incident) or '-'}",
        f"Region:    {where.region(incident) or '-'}",
        f"Tenant:    {where.tenants.get(incident.tenant_id, '-') if incident.tenant_id else '-'}",
        f"Resolved:  {incident.resolved_at:%Y-%m-%d %H:%M:%S} UTC" if incident.resolved_at else "Resolved:  not yet",
        "",
        "Evidence:",
        evidence,
        "",
        f"Acknowledge, assign or resolve it: {console_url(incident.pk)}",
    ]
    return subject, "\n".join(lines) + "\n"


def webhook_payload(incident: Incident, where: Where, severity: str) -> dict:
    """
    The webhook's JSON, shaped as Alertmanager's webhook (version 4, one alert) so receivers that
    read Alertmanager read it; ``incident`` carries the whole record besides.
    """
    url = console_url(incident.pk)
    labels = {"alertname": incident.kind, "severity": severity, "incident_id": str(incident.pk),
              **({"node": where.node(incident)} if where.node(incident) else {}),
              **({"region": where.region(incident)} if where.region(incident) else {}),
              **({"tenant_id": str(incident.tenant_id)} if incident.tenant_id else {})}
    annotations = {"summary": incident.summary, "console_url": url}
    status = "resolved" if incident.resolved_at else "firing"
    started = incident.impact_started_at or incident.detected_at
    return {
        "version": "4",
        "receiver": "meridian-oncall",
        "status": status,
        "groupKey": f"meridian:incident:{incident.pk}",
        "truncatedAlerts": 0,
        "externalURL": settings.MERIDIAN_PUBLIC_URL,
        "groupLabels": {"incident_id": str(incident.pk)},
        "commonLabels": labels,
        "commonAnnotations": annotations,
        "alerts": [{"status": status, "labels": labels, "annotations": annotations, "startsAt": started.isoformat(),
                    "endsAt": incident.resolved_at.isoformat() if incident.resolved_at else "0001-01-01T00:00:00Z",
                    "generatorURL": url, "fingerprint": incident.pk.hex[:16]}],
        "incident": {"id": str(incident.pk), "kind": incident.kind, "severity": severity,
                     "summary": incident.summary, "detected_at": incident.detected_at.isoformat(),
                     "impact_started_at": incident.impact_started_at.isoformat() if incident.impact_started_at
                     else None,
                     "resolved_at": incident.resolved_at.isoformat() if incident.resolved_at else None,
                     "node_id": str(incident.node_id) if incident.node_id else None, "node": where.node(incident),
                     "region": where.region(incident),
                     "tenant_id": str(incident.tenant_id) if incident.tenant_id else None,
                     "evidence": incident.evidence, "url": url},
    }


#
# Sending
#


class Round:
    """One round's senders: one SMTP connection, and each channel tried until it first fails."""

    def __init__(self):
        self.began = time.monotonic()
        self.mail = get_connection(fail_silently=False)
        self.down: dict[str, str] = {}  # channel -> the error it failed with this round

    @property
    def over_budget(self) -> bool:
        return time.monotonic() - self.began > ROUND_BUDGET_S

    def email(self, to: list[str], subject: str, body: str) -> str:
        """Send; the error ("" when sent)."""
        if "email" in self.down:
            return f"not tried: {self.down['email']}"
        try:
            EmailMessage(subject, body, to=to, connection=self.mail).send()
        except Exception as exc:  # noqa: BLE001 -- any failure of the mail server is a failed send, retried
            self.down["email"] = f"{type(exc).__name__}: {exc}"[:300]
            self._close_mail()
            return self.down["email"]
        return ""

    def webhook(self, url: str, payload: dict, incident_id) -> str:
        if "webhook" in self.down:
            return f"not tried: {self.down['webhook']}"
        body = json.dumps(payload, separators=(",", ":"), sort_keys=True).encode()
        headers = {"Content-Type": "application/json", "User-Agent": USER_AGENT,
                   "Meridian-Incident": str(incident_id)}
        if settings.MERIDIAN_ONCALL_WEBHOOK_SECRET:
            headers["Meridian-Signature"] = signature_header(settings.MERIDIAN_ONCALL_WEBHOOK_SECRET,
                                                             int(time.time()), body)
        try:
            answer = requests.post(url, data=body, headers=headers, timeout=WEBHOOK_TIMEOUT_S, allow_redirects=False)
        except requests.RequestException as exc:
            self.down["webhook"] = f"{type(exc).__name__}: {exc}"[:300]
            return self.down["webhook"]
        if not 200 <= answer.status_code < 300:
            self.down["webhook"] = f"HTTP {answer.status_code}: {answer.text[:200]}"
            return self.down["webhook"]
        return ""

    def close(self) -> None:
        self._close_mail()

    def _close_mail(self) -> None:
        with contextlib.suppress(Exception):  # a broken connection is dropped either way
            self.mail.close()


def page_round(*, now: datetime | None = None) -> dict:
    """One round: page the claimed incidents, send the due staff notices; counts of what happened."""
    now = now or timezone.now()
    senders = Round()
    counts = {"sent": 0, "skipped": 0, "retrying": 0, "given_up": 0, "notices_sent": 0, "notices_failed": 0}
    try:
        incidents = _claim(now)
        where = Where.of(incidents)
        for done, incident in enumerate(incidents):
            if senders.over_budget:  # the rest go back for the next round
                Incident.objects.filter(pk__in=[i.pk for i in incidents[done:]], notified_at__isnull=True).update(
                    notify_next_at=None)
                break
            counts[_page(incident, where, senders)] += 1
        notices = _claim_notices(now)
        for done, notice in enumerate(notices):
            if senders.over_budget:
                IncidentNotice.objects.filter(pk__in=[n.pk for n in notices[done:]], sent_at__isnull=True).update(
                    next_attempt_at=None)
                break
            counts["notices_sent" if _tell(notice, senders) else "notices_failed"] += 1
    finally:
        senders.close()
    return counts


def _claim(now: datetime) -> list[Incident]:
    with transaction.atomic():
        incidents = list(Incident.objects.select_for_update(skip_locked=True)
                         .filter(Q(notify_next_at__isnull=True) | Q(notify_next_at__lte=now), notified_at__isnull=True)
                         .order_by("detected_at")[:BATCH])
        if incidents:
            Incident.objects.filter(pk__in=[i.pk for i in incidents]).update(notify_next_at=now + LEASE)
    return incidents


def _page(incident: Incident, where: Where, senders: Round) -> str:
    """Send what the incident still needs and mark it; what became of it."""
    severity = severity_of(incident.kind)
    to = [a.strip() for a in settings.MERIDIAN_ONCALL_EMAIL if a.strip()]
    to = to if at_least(severity, settings.MERIDIAN_ONCALL_MIN_SEVERITY) else []
    url = settings.MERIDIAN_ONCALL_WEBHOOK_URL if at_least(severity, settings.MERIDIAN_ONCALL_PAGE_SEVERITY) else ""
    if "platform_incident" in (incident.evidence or {}):
        to, url = [], ""  # a tenant's copy: its platform incident is the page
    changes: dict = {}
    errors = []
    if to and incident.emailed_at is None:
        error = senders.email(to, *email_message(incident, where, severity))
        changes["emailed_at"] = None if error else timezone.now()
        errors += [f"e-mail: {error}"] if error else []
    if url and incident.webhook_sent_at is None:
        error = senders.webhook(url, webhook_payload(incident, where, severity), incident.pk)
        changes["webhook_sent_at"] = None if error else timezone.now()
        errors += [f"webhook: {error}"] if error else []
    done = timezone.now()
    if not changes:
        outcome = "skipped"
        changes = {"notified_at": done, "notify_next_at": None}
    else:
        changes = {k: v for k, v in changes.items() if v is not None}
        attempts = incident.notify_attempts + 1
        changes |= {"notify_attempts": attempts, "notify_error": "; ".join(errors)[:500]}
        if not errors:
            outcome, changes["notified_at"], changes["notify_next_at"] = "sent", done, None
        elif attempts >= settings.MERIDIAN_ONCALL_MAX_ATTEMPTS:
            outcome, changes["notified_at"], changes["notify_next_at"] = "given_up", done, None
            log.error("Giving up paging incident %s (%s) after %s attempts: %s", incident.pk, incident.kind,
                      attempts, changes["notify_error"])
        else:
            outcome, changes["notify_next_at"] = "retrying", done + backoff(attempts)
            log.warning("Paging incident %s (%s) failed (attempt %s), trying again after %s: %s", incident.pk,
                        incident.kind, attempts, changes["notify_next_at"], changes["notify_error"])
    with transaction.atomic():
        Incident.objects.filter(pk=incident.pk, notified_at__isnull=True).update(**changes)
    return outcome


def _claim_notices(now: datetime) -> list[IncidentNotice]:
    with transaction.atomic():
        notices = list(IncidentNotice.objects.select_for_update(skip_locked=True)
                       .filter(Q(next_attempt_at__isnull=True) | Q(next_attempt_at__lte=now), sent_at__isnull=True,
                               attempts__lt=settings.MERIDIAN_ONCALL_MAX_ATTEMPTS)
                       .order_by("created_at")[:BATCH])
        if notices:
            IncidentNotice.objects.filter(pk__in=[n.pk for n in notices]).update(next_attempt_at=now + LEASE)
    return notices


def _tell(notice: IncidentNotice, senders: Round) -> bool:
    error = senders.email([notice.to], notice.subject, notice.body)
    done = timezone.now()
    attempts = notice.attempts + 1
    if error and attempts >= settings.MERIDIAN_ONCALL_MAX_ATTEMPTS:
        log.error("Giving up telling %s about incident %s after %s attempts: %s", notice.to, notice.incident_id,
                  attempts, error)
    with transaction.atomic():
        IncidentNotice.objects.filter(pk=notice.pk, sent_at__isnull=True).update(
            attempts=attempts, last_error=error[:500], sent_at=None if error else done,
            next_attempt_at=done + backoff(attempts) if error else None)
    return not error
