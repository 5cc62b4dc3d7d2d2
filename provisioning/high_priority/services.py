"""
High-priority status of teams (DESIGN.md "Priority"): the team's record, applications and their
review, and the periodic expiry and revocation.

A team applies with its record frozen in the application (``hp_assess``); a platform reviewer
who is not in the team approves or rejects it; approval gives the team status until
``MERIDIAN_HP_VALIDITY_DAYS`` from now, which the priority score reads through
``Team.high_priority_until`` (provisioning.scheduling.team_record). ``hp_revoke_due`` (beat, hourly) expires
status that ran out and revokes status whose team's record fell below the thresholds.

Lock order, everywhere: the team row, then the application row.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Count, Q
from django.utils import timezone

from core.errors import Conflict, DomainError, Forbidden
from provisioning.choices import ReservationState as R
from provisioning.models import Reservation
from provisioning.scheduling.priority import HPThresholds, hp_eligible
from provisioning.scheduling.team_record import NOT_USED, RECORD_WINDOW, USED
from security.audit import audit_record
from security.models import AuditEvent
from tenants.choices import PlatformRole, TenantRole
from tenants.models import HighPriorityApplication, HighPriorityState, Membership, Team, TeamMembership
from tenants.notifications import notify
from tenants.scoping import Principal

log = logging.getLogger(__name__)

S = HighPriorityState

THRESHOLDS_NOT_MET = (
    "The team's record does not meet the high-priority thresholds: {reasons}. Apply again once the record "
    "qualifies, or ask a platform admin to file the application with an override note."
)
APPLICATION_PENDING = "The team already has a pending application ({id}); withdraw it or wait for its review."
NOT_PENDING = "The application is {state}; only a pending application can be {verb}."
APPLY_NOT_ALLOWED = "Only members of the team and the tenant's admins can apply for its high-priority status."
APPROVERS_DO_NOT_APPLY = "Platform approvers review applications; a team member or a platform admin files them."
OVERRIDE_ADMINS_ONLY = "Only a platform admin can file an application with an override note."
REVIEWERS_ONLY = "Only platform approvers and platform admins, acting platform-wide, review applications."
REVIEWER_IN_TEAM = ("You belong to this team (or administer its tenant), so you cannot review its application; "
                    "ask another platform approver.")
REVIEWER_IS_APPLICANT = "You filed this application on the team's behalf; another platform approver must review it."
NOTE_REQUIRED = "Say why: the note is shown to the team and kept in the audit trail."

CANCEL, EXTEND = "reservation.cancel", "reservation.extend"
RESERVATION = Reservation._meta.label_lower


#
# The team's record
#


@dataclass(frozen=True)
class HPRecord:
    """The three figures the thresholds are checked against."""

    fulfilment_rate_30d: float | None
    avg_release_delay_s: float
    unplanned_changes_month: int


def hp_thresholds() -> HPThresholds:
    """The thresholds from MERIDIAN_HP_THRESHOLDS (read at call time; a bad key raises ValueError)."""
    return HPThresholds.from_mapping(getattr(settings, "MERIDIAN_HP_THRESHOLDS", None))


def hp_validity() -> timedelta:
    return timedelta(days=getattr(settings, "MERIDIAN_HP_VALIDITY_DAYS", 90))


def team_hp_record(team: Team, *, now: datetime) -> HPRecord:
    """The team's record at ``now``: read-only, three or four queries whatever its history."""
    since = now - RECORD_WINDOW
    return HPRecord(
        fulfilment_rate_30d=_fulfilment_rate(team, since),
        avg_release_delay_s=_avg_release_delay_s(team, since, now),
        unplanned_changes_month=_unplanned_changes(team, month_start(now), now),
    )


def month_start(now: datetime) -> datetime:
    """Midnight of the first day of ``now``'s calendar month, in the project's time zone."""
    return timezone.localtime(now).replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def _fulfilment_rate(team: Team, since: datetime) -> float | None:
    """
    The team_record definition: of the reservations submitted in the window that were scheduled
    and reached an outcome, the share used as booked; None without any.
    """
    counts = Reservation.objects.filter(team=team, submitted_at__gte=since, scheduled_at__isnull=False).aggregate(
        total=Count("pk", filter=Q(state__in=USED | NOT_USED | {R.CANCELLED, R.PREEMPTED})),
        used=Count("pk", filter=Q(state__in=USED)),
    )
    return counts["used"] / counts["total"] if counts["total"] else None


def _avg_release_delay_s(team: Team, since: datetime, now: datetime) -> float:
    """How long after their booked end the window's released reservations gave their GPUs back (early: 0)."""
    ended = Reservation.objects.filter(team=team, released_at__gte=since, released_at__lte=now,
                                       ends_at__isnull=False).values_list("ends_at", "released_at")
    delays = [max(0.0, (released - ends).total_seconds()) for ends, released in ended]
    return sum(delays) / len(delays) if delays else 0.0


def _unplanned_changes(team: Team, start: datetime, now: datetime) -> int:
    """
    Changes after confirmation this month, read from the audit trail (the one record of who
    changed what): cancellations of reservations that had been scheduled, and extensions (only a
    scheduled, provisioning or active reservation can be extended). Platform-wide read on purpose.
    """
    events = list(AuditEvent.objects.filter(
        tenant_id=team.tenant_id, action__in=(CANCEL, EXTEND), target_type=RESERVATION,
        occurred_at__gte=start, occurred_at__lte=now,
    ).values_list("action", "target_id"))
    if not events:
        return 0
    scheduled = {
        str(pk): scheduled_at for pk, scheduled_at in
        Reservation.objects.filter(team=team, pk__in={target for _, target in events}).values_list("pk", "scheduled_at")
    }
    return sum(1 for action, target in events
               if target in scheduled and (action == EXTEND or scheduled[target] is not None))


def hp_assess(team: Team, *, now: datetime | None = None) -> dict:
    """
    The team's record against the thresholds, JSON-ready: the figures, the thresholds, each
    check met or not, the verdict and one reason per missed threshold. Frozen into applications.
    """
    now = now or timezone.now()
    record = team_hp_record(team, now=now)
    thresholds = hp_thresholds()
    verdict = hp_eligible(record.fulfilment_rate_30d, record.avg_release_delay_s, record.unplanned_changes_month,
                          thresholds)
    rate, delay, changes = record.fulfilment_rate_30d, record.avg_release_delay_s, record.unplanned_changes_month
    checks = [
        {"name": "fulfilment_rate_30d", "value": rate, "rule": "above", "threshold": thresholds.min_fulfilment,
         "met": rate is not None and rate > thresholds.min_fulfilment},
        {"name": "avg_release_delay_s", "value": delay, "rule": "below",
         "threshold": thresholds.max_avg_release_delay_s, "met": delay < thresholds.max_avg_release_delay_s},
        {"name": "unplanned_changes_month", "value": changes, "rule": "at_most",
         "threshold": thresholds.max_unplanned_changes, "met": changes <= thresholds.max_unplanned_changes},
    ]
    return {"computed_at": now.isoformat(), "figures": asdict(record), "thresholds": asdict(thresholds),
            "checks": checks, **verdict.as_dict()}


#
# Apply, withdraw
#


def hp_check_can_apply(actor: Principal, team: Team) -> None:
    """Team members (member role or above) and tenant admins apply; platform admins on a team's behalf."""
    if actor.is_platform:
        if not actor.is_platform_admin:
            raise Forbidden(APPROVERS_DO_NOT_APPLY)
        return
    in_tenant = actor.tenant is not None and actor.tenant.pk == team.tenant_id
    in_team = actor.sees_all_teams or team.pk in actor.team_ids
    if not (in_tenant and actor.has_role(TenantRole.MEMBER) and in_team):
        raise Forbidden(APPLY_NOT_ALLOWED)


def _required_note(value: str, field: str = "note") -> str:
    value = (value or "").strip()
    if not value:
        raise DomainError({field: NOTE_REQUIRED}, code="required")
    return value


@transaction.atomic
def hp_apply(*, actor: Principal, team: Team, note: str, override_note: str = "") -> HighPriorityApplication:
    """
    File a high-priority application for ``team`` with its record frozen in it. 403 unless the
    actor may apply (see hp_check_can_apply); 409 ``hp_application_pending`` while one is pending;
    409 ``hp_thresholds_not_met`` with the reasons when the record falls short, unless a platform
    admin gives an ``override_note`` (kept on the application and in the audit event).
    """
    note = _required_note(note)
    override_note = (override_note or "").strip()
    hp_check_can_apply(actor, team)
    if override_note and not actor.is_platform_admin:
        raise Forbidden(OVERRIDE_ADMINS_ONLY, code="hp_override_not_allowed")
    # The team's row serialises its applications: one pending at a time.
    team = Team.objects.select_for_update(of=("self",)).select_related("tenant").get(pk=team.pk)
    pending = HighPriorityApplication.objects.filter(team=team, state=S.PENDING).values_list("pk", flat=True).first()
    if pending is not None:
        raise Conflict(APPLICATION_PENDING.format(id=pending), code="hp_application_pending", application=str(pending))
    snapshot = hp_assess(team)
    if not snapshot["eligible"] and not override_note:
        raise Conflict(THRESHOLDS_NOT_MET.format(reasons="; ".join(snapshot["reasons"])),
                       code="hp_thresholds_not_met", reasons=snapshot["reasons"], checks=snapshot["checks"])
    application = HighPriorityApplication.objects.create(
        tenant_id=team.tenant_id, team=team, applied_by=actor.user, note=note, override_note=override_note,
        snapshot=snapshot,
    )
    audit_record(actor=actor, action="high_priority_application.create", target=application, after={
        "team": str(team.pk), "eligible": snapshot["eligible"], "reasons": snapshot["reasons"],
        "override_note": override_note,
    })
    if actor.is_platform:
        notify(team.tenant, team=team, kind="high_priority.applied",
               title=f"A platform admin applied for high priority for team {team.name}",
               body=f"Note: {note}" + (f"\nOverride of the thresholds: {override_note}" if override_note else ""),
               link=application_link(application))
    return application


@transaction.atomic
def hp_withdraw(*, actor: Principal, application: HighPriorityApplication) -> HighPriorityApplication:
    """The applicant team takes back its pending application; 409 once it is no longer pending."""
    hp_check_can_apply(actor, application.team)
    now = timezone.now()
    moved = HighPriorityApplication.objects.filter(pk=application.pk, state=S.PENDING).update(
        state=S.WITHDRAWN, state_changed_at=now)
    application.refresh_from_db()
    if not moved:
        raise Conflict(NOT_PENDING.format(state=application.state, verb="withdrawn"),
                       code="hp_application_not_pending", current_state=application.state)
    audit_record(actor=actor, action="high_priority_application.withdraw", target=application,
                 before={"state": S.PENDING}, after={"state": S.WITHDRAWN})
    return application


#
# Review
#


DECISIONS = {"approve": S.APPROVED, "reject": S.REJECTED}


def is_reviewer(actor: Principal) -> bool:
    """Platform approvers and platform admins, acting platform-wide."""
    return actor.is_platform and actor.platform_role in (PlatformRole.APPROVER, PlatformRole.ADMIN)


def hp_reviewer_in_team(user, application: HighPriorityApplication) -> bool:
    """In the team, or an admin or owner of its tenant (who acts for every team there)."""
    return (TeamMembership.objects.filter(team_id=application.team_id, user=user).exists()
            or Membership.objects.filter(tenant_id=application.tenant_id, user=user,
                                         role__in=(TenantRole.ADMIN, TenantRole.OWNER)).exists())


@transaction.atomic
def hp_review(*, actor: Principal, application: HighPriorityApplication, decision: str,
              note: str) -> HighPriorityApplication:
    """
    Approve or reject a pending application. 403 unless a platform reviewer, and 403
    ``hp_reviewer_in_team`` for one in the team; 400 without a note. The row is locked and must
    still be pending (409 ``hp_application_not_pending`` names its state, so of two reviews at
    once exactly one wins). Approval gives the team status for MERIDIAN_HP_VALIDITY_DAYS (a
    renewal replaces the earlier approval, which ends ``expired``); rejection leaves the team as it
    was. Audited, and the applicant and the team are notified with the outcome and the reasons.
    """
    if not is_reviewer(actor):
        raise Forbidden(REVIEWERS_ONLY)
    note = _required_note(note)
    if decision not in DECISIONS:
        raise DomainError({"decision": f"Choose one of: {', '.join(DECISIONS)}."}, code="invalid_choice")
    if hp_reviewer_in_team(actor.user, application):
        raise Forbidden(REVIEWER_IN_TEAM, code="hp_reviewer_in_team")
    if application.applied_by_id == actor.user.pk:
        # A platform admin who filed on a team's behalf does not also decide it.
        raise Forbidden(REVIEWER_IS_APPLICANT, code="hp_reviewer_is_applicant")
    team = Team.objects.select_for_update(of=("self",)).select_related("tenant").get(pk=application.team_id)
    application = HighPriorityApplication.objects.select_for_update().get(pk=application.pk)
    if application.state != S.PENDING:
        raise Conflict(NOT_PENDING.format(state=application.state, verb="reviewed"),
                       code="hp_application_not_pending", current_state=application.state)
    now = timezone.now()
    before = {"state": application.state, "team_high_priority_until": _iso(team.high_priority_until)}
    application.state, application.state_changed_at = DECISIONS[decision], now
    application.reviewed_by, application.review_note, application.reviewed_at = actor.user, note, now
    if application.state == S.APPROVED:
        application.expires_at = now + hp_validity()
        HighPriorityApplication.objects.filter(team=team, state=S.APPROVED).update(
            state=S.EXPIRED, state_changed_at=now, state_reason=f"Replaced by the renewal approved on {now:%Y-%m-%d}.")
        team.high_priority_until, team.high_priority_application = application.expires_at, application
        team.save(update_fields=["high_priority_until", "high_priority_application"])
    application.save(update_fields=["state", "state_changed_at", "reviewed_by", "review_note", "reviewed_at",
                                    "expires_at"])
    audit_record(actor=actor, action=f"high_priority_application.{decision}", target=application, before=before,
                 after={"state": application.state, "review_note": note,
                        "team_high_priority_until": _iso(team.high_priority_until)})
    _notify_review(application, team)
    return application


def _notify_review(application: HighPriorityApplication, team: Team) -> None:
    """
    The outcome and why, to the whole team, and to the applicant in person only when they are
    still in the tenant but no longer read the team's messages (out of the team, not an admin):
    nobody reads it twice.
    """
    if application.state == S.APPROVED:
        title = f"High priority approved for team {team.name}"
        outcome = f"The team holds high-priority status until {application.expires_at:%Y-%m-%d %H:%M} UTC."
    else:
        title = f"High priority rejected for team {team.name}"
        outcome = "The team's status is unchanged."
    reasons = application.snapshot.get("reasons") or []
    record = f"\nThe record at application fell short: {'; '.join(reasons)}." if reasons else ""
    body = f"{outcome}\nReviewer's note: {application.review_note}{record}"
    kind = f"high_priority.{application.state}"
    link = application_link(application)
    applicant = application.applied_by
    if applicant is not None and _reads_only_in_person(applicant, team):
        notify(team.tenant, user=applicant, kind=kind, title=title, body=body, link=link)
    notify(team.tenant, team=team, kind=kind, title=title, body=body, link=link)


def _reads_only_in_person(user, team: Team) -> bool:
    """In ``team``'s tenant, but not among those who read its messages (its members and the tenant's admins)."""
    membership = Membership.objects.filter(tenant_id=team.tenant_id, user=user).first()
    if membership is None or TenantRole(membership.role).at_least(TenantRole.ADMIN):
        return False
    return not TeamMembership.objects.filter(team=team, user=user).exists()


#
# Expiry and revocation
#


def hp_revoke_due(*, now: datetime | None = None) -> dict[str, int]:
    """
    For every team holding status (platform-wide, on purpose): status past its end expires;
    status whose team's record now falls below the thresholds is revoked with the reasons. Each
    team in its own transaction, audited as the system's act and notified; a team that fails is
    logged and retried on the next run. Returns how many teams expired, were revoked or kept it.
    """
    now = now or timezone.now()
    report = {"expired": 0, "revoked": 0, "kept": 0, "errors": 0}
    for team in (Team.objects.filter(high_priority_until__isnull=False).select_related("high_priority_application")
                 .order_by("pk")):
        try:
            if team.high_priority_until <= now:
                outcome = _end_status(team.pk, now=now, target=S.EXPIRED, reasons=[])
            else:
                snapshot = hp_assess(team, now=now)
                reasons = _revocation_reasons(team.high_priority_application, snapshot)
                outcome = "kept" if not reasons else _end_status(
                    team.pk, now=now, target=S.REVOKED, reasons=reasons,
                    assessed=team.high_priority_application_id)
        except Exception:
            log.exception("high priority: ending the status of team %s failed", team.pk)
            outcome = "errors"
        report[outcome] += 1
    return report


def _revocation_reasons(application: HighPriorityApplication | None, now_snapshot: dict) -> list[str]:
    """
    Why the status should go now: the thresholds the record misses -- or, for a status granted
    over the thresholds by an admin's override, only the figures that got worse than when it
    was granted (it was below the thresholds on purpose).
    """
    if now_snapshot["eligible"]:
        return []
    if application is None or not application.override_note:
        return list(now_snapshot["reasons"])
    then = {check["name"]: check["value"] for check in (application.snapshot or {}).get("checks", [])}
    worse = []
    for check in now_snapshot["checks"]:
        before, value = then.get(check["name"]), check["value"]
        if check["met"] or value is None:
            continue
        if before is None:  # no figure when granted (a new team): the record it has now misses
            worse.append(f"{check['name'].replace('_', ' ')} is {value:g}, below the threshold, since the approval")
        elif (value < before) if check["rule"] == "above" else (value > before):
            worse.append(f"{check['name'].replace('_', ' ')} worsened from {before:g} to {value:g} since the approval")
    return worse


@transaction.atomic
def _end_status(team_id, *, now: datetime, target: str, reasons: list[str], assessed=None) -> str:
    """Clear the team's status and move its application to ``target``; "kept" if it changed meanwhile."""
    team = (Team.objects.select_for_update(of=("self",)).select_related("tenant", "high_priority_application")
            .get(pk=team_id))
    ran_out = team.high_priority_until is not None and team.high_priority_until <= now
    if team.high_priority_until is None or ran_out != (target == S.EXPIRED):
        return "kept"
    if target == S.REVOKED and team.high_priority_application_id != assessed:
        return "kept"  # renewed since its record was read: the next run judges the new approval
    if target == S.EXPIRED:
        why = f"The status ran out on {team.high_priority_until:%Y-%m-%d %H:%M} UTC."
    else:
        why = "The team's record fell below the thresholds: " + "; ".join(reasons) + "."
    application = team.high_priority_application
    if application is not None:
        HighPriorityApplication.objects.filter(pk=application.pk, state=S.APPROVED).update(
            state=target, state_changed_at=now, state_reason=why)
    before = {"team_high_priority_until": _iso(team.high_priority_until)}
    team.high_priority_until, team.high_priority_application = None, None
    team.save(update_fields=["high_priority_until", "high_priority_application"])
    verb = "expire" if target == S.EXPIRED else "revoke"
    audit_record(actor=None, action=f"high_priority_application.{verb}", target=application or team,
                 tenant_id=team.tenant_id, before=before, after={"state": target, "reasons": reasons})
    notify(team.tenant, team=team, kind=f"high_priority.{target}",
           title=f"High priority {target} for team {team.name}",
           body=why + " Apply again when the record qualifies.",
           link=application_link(application) if application else "")
    return "expired" if target == S.EXPIRED else "revoked"


def application_link(application: HighPriorityApplication) -> str:
    return f"/api/v1/high-priority-applications/{application.pk}/"


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None
