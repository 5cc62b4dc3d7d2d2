"""
The console's high-priority and notification pages (DESIGN.md "Priority", "Money and messages").

- ``/high-priority/``: each of the principal's teams with its status, its record now against the
  thresholds (``hp_assess``), an application form, and its applications with their outcome;
  withdraw a pending one. ``/high-priority/applications/<id>/``: one application (the target of
  the high-priority notifications).
- ``/staff/high-priority/`` (platform staff): pending applications first with the record frozen in
  them, then recent decisions; a review page (approve or reject, with a note); a platform admin
  files an application on a team's behalf, with an override note when it falls short.
- ``/notifications/``: the principal's notifications, newest first; mark one (htmx swaps the row)
  or all read.

Thin, like the API's views (tenants/api/views.py): a view parses a form, calls one service with
``actor=request.principal`` and renders; a service's refusal (DomainError) comes back on the form
or as a flash message in the service's words and with its HTTP status, never a 500. Rows are read
through ``scoped``, so another tenant's application or notification is a 404. Each page costs a
fixed number of queries however many applications or notifications it lists (the team page adds
``hp_assess``'s few queries per team shown).
"""

from __future__ import annotations

from django.contrib import messages
from django.core.paginator import Paginator
from django.db.models import Prefetch
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.views.decorators.http import require_POST

from core.errors import DomainError
from provisioning.high_priority import services as hp
from provisioning.high_priority.forms import ApplyForm, ReviewForm, StaffApplyForm
from tenants.models import HighPriorityApplication, HighPriorityState, Team
from tenants.scoping import Principal
from web.console import (
    CHANGE,
    VIEW,
    add_domain_error,
    chosen_team_id,
    console_page,
    error_text,
    scoped,
    scoped_or_404,
)

POLICY = "high-priority-applications"
PAGE_SIZE = 50
APPLICATIONS_SHOWN = 20  # per team on the team page; older ones stay in the API
DECIDED_SHOWN = 25  # recent decisions under the staff page's pending ones
PENDING = HighPriorityState.PENDING

#
# The record, as shown
#

CHECK_LABELS = {
    "fulfilment_rate_30d": "Fulfilment rate, last 30 days",
    "avg_release_delay_s": "Average release delay",
    "unplanned_changes_month": "Unplanned changes this month",
}
RULE_SIGNS = {"above": ">", "below": "<", "at_most": "≤"}


def _figure(name: str, value) -> str:
    if value is None:
        return "none (no reservations in 30 days)"
    if name == "fulfilment_rate_30d":
        return f"{value:.1%}"
    if name == "avg_release_delay_s":
        return f"{value / 60:.1f} min"
    return str(value)


def record_checks(snapshot: dict | None) -> list[dict]:
    """
    A team's record in ``hp_assess``'s shape (live, or frozen in an application) as table rows:
    the figure, its threshold and whether it is met, in the order the service checks them.
    """
    rows = []
    for check in (snapshot or {}).get("checks") or []:
        name = check.get("name", "")
        threshold = check.get("threshold")
        rows.append({
            "label": CHECK_LABELS.get(name, name),
            "value": _figure(name, check.get("value")),
            "threshold": "" if threshold is None else f"{RULE_SIGNS.get(check.get('rule'), '')} "
                                                      f"{_figure(name, threshold)}".strip(),
            "met": bool(check.get("met")),
        })
    return rows


def _may_apply(principal: Principal, team: Team) -> bool:
    """Whether the service would let ``principal`` apply for (or withdraw) ``team``'s application."""
    try:
        hp.hp_check_can_apply(principal, team)
    except DomainError:
        return False
    return principal.can_write


def _with_checks(applications):
    """Each application's frozen record as rows, and when it was frozen."""
    for application in applications:
        application.checks = record_checks(application.snapshot)
        application.record_at = parse_datetime((application.snapshot or {}).get("computed_at") or "")
    return applications


#
# Team side
#


@console_page(POLICY)
def high_priority(request):
    """The principal's teams: status, record now, the application form, past and pending applications."""
    return _teams_page(request)


def _teams_page(request, *, forms: dict | None = None, status: int = 200):
    principal = request.principal
    if principal.tenant is None:
        return redirect("staff-high-priority" if principal.is_platform else "console-tenants")
    forms = forms or {}
    applications = scoped(request, HighPriorityApplication).select_related("applied_by").order_by("-created_at")
    teams = scoped(request, Team).order_by("name").prefetch_related(Prefetch(
        "high_priority_applications", queryset=applications[:APPLICATIONS_SHOWN], to_attr="applications"))
    if not principal.sees_all_teams:
        # Applications are the team's (a member outside it cannot read them), so the page lists
        # the teams whose applications the principal reads: their own, or all for tenant admins.
        teams = teams.filter(pk__in=principal.team_ids)
    team_id = chosen_team_id(request)
    if team_id:
        teams = teams.filter(pk=team_id)
    teams = list(teams)
    now = timezone.now()
    for team in teams:
        team.record = hp.hp_assess(team, now=now)
        team.checks = record_checks(team.record)
        team.holds_status = team.is_high_priority(now)
        # One pending application per team (constraint), and it blocks newer ones: it is the newest.
        team.pending = next((a for a in team.applications if a.state == PENDING), None)
        team.may_apply = _may_apply(principal, team)
        team.form = forms.get(team.pk) or ApplyForm(auto_id=f"apply-{team.pk}-%s")
        _with_checks(team.applications)
    shown = {team.pk for team in teams}
    for team_pk, form in forms.items():
        if team_pk not in shown:  # the refusal of a team the page does not list: say it on top
            for error in form.non_field_errors():
                messages.error(request, error)
    thresholds = hp.hp_thresholds()
    return render(request, "tenants/high_priority.html", {
        "teams": teams, "validity_days": hp.hp_validity().days,
        "rules": {"fulfilment": _figure("fulfilment_rate_30d", thresholds.min_fulfilment),
                  "delay": _figure("avg_release_delay_s", thresholds.max_avg_release_delay_s),
                  "changes": thresholds.max_unplanned_changes},
        "team_chosen": bool(team_id),
    }, status=status)


@require_POST
@console_page(POLICY)
def high_priority_apply(request, team_pk):
    """File the team's application; a record below the thresholds comes back with the reasons (409)."""
    team = scoped_or_404(request, Team, CHANGE, pk=team_pk)
    form = ApplyForm(request.POST, auto_id=f"apply-{team.pk}-%s")
    status = 400
    if form.is_valid():
        try:
            application = hp.hp_apply(actor=request.principal, team=team, note=form.cleaned_data["note"])
        except DomainError as exc:
            add_domain_error(form, exc)
            status = exc.status_code
        else:
            messages.success(request, f"The application for {team.name} is filed; a platform reviewer decides it.")
            return redirect(f"{reverse('high-priority')}#application-{application.pk}")
    return _teams_page(request, forms={team.pk: form}, status=status)


@console_page(POLICY)
def high_priority_application(request, pk):
    """One application: its record as filed, its outcome and why; withdraw while pending."""
    if request.principal.is_platform:
        return redirect("staff-high-priority-review", pk=pk)
    application = scoped_or_404(request, HighPriorityApplication.objects.select_related("team", "applied_by"), pk=pk)
    _with_checks([application])
    return render(request, "tenants/high_priority_application.html", {
        "application": application,
        "may_withdraw": application.state == PENDING and _may_apply(request.principal, application.team),
    })


@require_POST
@console_page(POLICY)
def high_priority_withdraw(request, pk):
    application = scoped_or_404(request, HighPriorityApplication.objects.select_related("team"), CHANGE, pk=pk)
    try:
        hp.hp_withdraw(actor=request.principal, application=application)
    except DomainError as exc:
        messages.error(request, error_text(exc))
    else:
        messages.success(request, f"The application for {application.team.name} is withdrawn.")
    return redirect(f"{reverse('high-priority')}#application-{application.pk}")


#
# Staff side
#


def _staff_teams(request):
    """Every team, platform-wide, to file an application for (platform admins)."""
    return scoped(request, Team).select_related("tenant").order_by("tenant__name", "name")


@console_page(POLICY, platform=True)
def staff_high_priority(request):
    """Pending applications, oldest first, with their frozen record; then the latest decisions."""
    return _staff_page(request)


def _staff_page(request, *, apply_form: StaffApplyForm | None = None, status: int = 200):
    principal = request.principal
    applications = scoped(request, HighPriorityApplication).select_related("tenant", "team", "applied_by",
                                                                          "reviewed_by")
    pending = Paginator(applications.filter(state=PENDING).order_by("created_at", "pk"), PAGE_SIZE).get_page(
        request.GET.get("page"))
    decided = list(applications.exclude(state=PENDING).order_by("-state_changed_at", "pk")[:DECIDED_SHOWN])
    _with_checks(pending.object_list)
    _with_checks(decided)
    if apply_form is None and principal.is_platform_admin:
        apply_form = StaffApplyForm(teams=_staff_teams(request), auto_id="staff-apply-%s")
    return render(request, "staff/high_priority.html", {
        "pending": pending, "decided": decided, "apply_form": apply_form,
    }, status=status)


@require_POST
@console_page(POLICY, action="create", platform=True)
def staff_high_priority_apply(request):
    """A platform admin files for a team; with an override note even when its record falls short."""
    form = StaffApplyForm(request.POST, teams=_staff_teams(request), auto_id="staff-apply-%s")
    status = 400
    if form.is_valid():
        data = form.cleaned_data
        try:
            application = hp.hp_apply(actor=request.principal, team=data["team"], note=data["note"],
                                      override_note=data["override_note"])
        except DomainError as exc:
            add_domain_error(form, exc)
            status = exc.status_code
        else:
            team = data["team"]
            messages.success(request, f"The application for {team.tenant.name} / {team.name} is filed; the team "
                                      "is told.")
            return redirect("staff-high-priority-review", pk=application.pk)
    return _staff_page(request, apply_form=form, status=status)


@console_page(POLICY, action="review", platform=True)
def staff_high_priority_review(request, pk):
    """
    One application with the record frozen in it (and the record now), and the decision form.
    Reviewers read every tenant's applications but change none by the scoping rule; the review
    is their one write, decided by ``hp_review`` (as the API's review action does).
    """
    applications = HighPriorityApplication.objects.select_related("tenant", "team", "applied_by", "reviewed_by")
    application = scoped_or_404(request, applications, VIEW, pk=pk)
    form = ReviewForm(request.POST or None, auto_id="review-%s")
    status = 200
    if request.method == "POST":
        status = 400
        if form.is_valid():
            try:
                application = hp.hp_review(actor=request.principal, application=application,
                                           decision=form.cleaned_data["decision"], note=form.cleaned_data["note"])
            except DomainError as exc:
                add_domain_error(form, exc)
                status = exc.status_code
                application = scoped_or_404(request, applications, VIEW, pk=pk)  # the state that won, if it moved
            else:
                messages.success(request, f"The application of {application.team.name} is {application.state}; "
                                          "the team is told.")
                return redirect("staff-high-priority-review", pk=pk)
    _with_checks([application])
    in_team = application.state == PENDING and not form.is_bound and hp.hp_reviewer_in_team(request.user, application)
    now = timezone.now()
    record_now = hp.hp_assess(application.team, now=now) if application.state == PENDING else None
    return render(request, "staff/high_priority_review.html", {
        "application": application, "form": form, "team": application.team,
        "team_holds_status": application.team.is_high_priority(now),
        "blocked": hp.REVIEWER_IN_TEAM if in_team else "",
        "record_now": record_checks(record_now) if record_now else [],
        "eligible_now": bool(record_now and record_now.get("eligible")),
        "reasons_now": (record_now or {}).get("reasons") or [],
    }, status=status)
