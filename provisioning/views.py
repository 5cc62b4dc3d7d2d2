"""
The console's reservation pages: the list, the new-reservation form with its live estimate, and
a reservation's page with its live progress, score, allocation, receipts and instances. Thin:
the form is checked by the API's serializer and every change is a provisioning service call.
"""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.contrib import messages
from django.core.paginator import Paginator
from django.db.models import Prefetch
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from cloud.telemetry.charts import gpu_sparklines
from core.errors import DomainError
from provisioning import estimates, history, services, usage
from provisioning.choices import ReservationState as R
from provisioning.forms import ReservationForm
from provisioning.gpu_cards import gpu_cards
from provisioning.lifecycle.no_shows import usage_report
from provisioning.models import Allocation, Instance, PortMembership, Reservation
from provisioning.progress import progress_of
from provisioning.receipts import receipts_of
from provisioning.scheduling.queue import score_report
from provisioning.telemetry import reservation_telemetry
from web.charts import line_chart, round_up, time_labels
from web.console import CHANGE, add_domain_error, chosen_team_id, console_page, error_text, may, scoped, scoped_or_404

PAGE_SIZE = 50
USAGE_SHOWN = {R.ACTIVE, R.RELEASING, R.NO_SHOW}
LIVE_STATES = {R.PENDING, R.QUEUED, R.SCHEDULED, R.PROVISIONING, R.RELEASING}
CANCELLABLE = {R.PENDING, R.QUEUED, R.SCHEDULED, R.PROVISIONING}
# The API names the count by what an offering sells (gpus, nodes, slots); the form calls it count.
COUNT_ALIASES = {"gpus": "count", "nodes": "count", "slots": "count", "regions": "region"}


@console_page("reservations")
def reservation_list(request):
    reservations = scoped(request, Reservation).select_related("offering", "region", "team")
    team_id = chosen_team_id(request)
    if team_id:
        reservations = reservations.filter(team_id=team_id)
    state = request.GET.get("state", "")
    if state in R.values:
        reservations = reservations.filter(state=state)
    page = Paginator(reservations.order_by("-submitted_at"), PAGE_SIZE).get_page(request.GET.get("page"))
    return render(request, "provisioning/reservation_list.html",
                  {"page": page, "state": state, "states": R.choices})


@console_page("reservations")
def reservation_new(request):
    """
    The form. Its estimate panel follows what is typed (htmx, ``reservation_estimate``); without
    script the form's "Check price and availability" button posts it here and the panel is drawn
    with the page. A viewer, who may look but not reserve, gets a notice instead of the form.
    """
    if not may(request.principal, "reservations"):
        return render(request, "provisioning/reservation_new.html", {"read_only": True})
    chosen = request.GET.get("offering", "")
    form = ReservationForm(request.POST or None, request=request, for_estimate=request.POST.get("action") == "estimate",
                           initial={"offering": chosen} if chosen else None)
    if request.method == "POST" and not form.for_estimate and form.is_valid():
        data = form.validated()
        if data is not None:
            try:
                reservation = services.reservation_create(actor=request.principal, ask=data["ask"],
                                                          team=data.get("team"))
            except DomainError as exc:
                add_domain_error(form, exc, aliases=COUNT_ALIASES)
            else:
                messages.success(request, f"{reservation.name} is {reservation.get_state_display().lower()}.")
                return redirect("reservation-detail", pk=reservation.pk)
    context = {"form": form, "cards": gpu_cards(), "chosen": chosen}
    if form.is_bound:
        # The panel shows what the form asks even where the form is refused (the name it needs not).
        estimate_form = form if form.for_estimate else ReservationForm(request.POST, request=request, for_estimate=True)
        context.update(_estimate_context(request, estimate_form))
        if not form.for_estimate:
            form.focus_first_error()
    failed = form.is_bound and not form.for_estimate and form.errors
    return render(request, "provisioning/reservation_new.html", context, status=400 if failed else 200)


@require_POST
@console_page("reservations")
def reservation_estimate(request):
    """
    The live panel beside the form (htmx): availability, price, quota left, expected start. A POST,
    so the SSH key and the CSRF token travel in the body, never in a URL or an access log.
    """
    form = ReservationForm(request.POST, request=request, for_estimate=True)
    # ``oob``: the one-line summary beside the Reserve button is swapped in too (htmx out of band).
    return render(request, "provisioning/_estimate.html", {**_estimate_context(request, form), "oob": True})


def _estimate_context(request, form: ReservationForm) -> dict:
    """
    The estimate of what ``form`` asks, or why there is none yet: fields still empty are named as
    what the estimate needs (nothing typed is nothing wrong), the other refusals as problems.
    """
    context = {"estimate": None, "problems": [], "needed": []}
    if form.is_valid() and (data := form.validated()) is not None:
        try:
            team = services.team_for(request.principal, data.get("team"))  # as the create would
        except DomainError as exc:
            context["problems"] = [error_text(exc)]
        else:
            context["estimate"] = estimates.estimate(ask=data["ask"], tenant=request.principal.tenant, team=team,
                                                     now=timezone.now())
            context["ask"] = data["ask"]
        return context
    for name, errors in form.errors.items():
        if name in form.fields and form.is_empty(name):
            context["needed"].append(form[name].label)
        elif name in form.fields:
            context["problems"].append(f"{form[name].label}: {' '.join(errors)}")
        else:
            context["problems"].append(" ".join(errors))
    return context


@console_page("reservations")
def reservation_detail(request, pk):
    shown = Reservation.objects.select_related("offering", "gpu_model", "region", "team", "vpc")
    reservation = scoped_or_404(request, shown, pk=pk)
    context = _progress_context(reservation)
    context.update({
        "reservation": reservation,
        "score": score_report(reservation) if reservation.state in (R.PENDING, R.QUEUED) else _score_only(reservation),
        "allocations": list(Allocation.objects.filter(reservation=reservation)
                            .select_related("gpu__node").order_by("gpu__node__hostname", "gpu__index")[:64]),
        "receipts": receipts_of(reservation),
        "instances": list(Instance.objects.filter(reservation=reservation).select_related("node").prefetch_related(
            Prefetch("memberships", queryset=PortMembership.objects.filter(left_at__isnull=True).exclude(address=None)
                     .order_by("address"), to_attr="ipoib"))),
        # The Connect card: what one needs to log in, how long is left and what it cost so far.
        "spent": (usage.spend_within(Reservation.objects.filter(pk=reservation.pk), since=reservation.starts_at,
                                     until=timezone.now()).amount
                  if reservation.state == R.ACTIVE and reservation.starts_at else None),
        # Is it used? The evidence a no-show or a reclaim would be judged on, shown before either.
        "usage": usage_report(reservation) if reservation.state in USAGE_SHOWN else None,
        "gpu_charts": gpu_charts(reservation) if reservation.state in (R.ACTIVE, R.RELEASING) else None,
        "queue_charts": queue_charts(reservation) if reservation.state == R.QUEUED else None,
        "can_cancel": reservation.state in CANCELLABLE,
        "can_release": reservation.state == R.ACTIVE,
        # The last stretch of an active reservation (the ending-soon notice's lead): a one-click extend.
        "ending_soon": reservation.state == R.ACTIVE and reservation.ends_at is not None
        and reservation.ends_at - timezone.now() <= settings.MERIDIAN_RESERVATION_ENDING_NOTICE,
        "can_read_console": may(request.principal, "instances", write=False, action="console"),
        "can_extend": reservation.state in (R.SCHEDULED, R.PROVISIONING, R.ACTIVE),
    })
    return render(request, "provisioning/reservation_detail.html", context)


def gpu_charts(reservation) -> list[dict]:
    """Each of the reservation's GPUs: its latest figures and its last hour as sparklines (three queries)."""
    memory_mib = reservation.gpu_model.memory_gib * 1024
    return [{"uuid": gpu["uuid"], "latest": gpu["latest"], **gpu_sparklines(gpu["series"], memory_mib=memory_mib)}
            for gpu in reservation_telemetry(reservation=reservation)["gpus"]]


QUEUE_ROWS_SHOWN = 12


def queue_charts(reservation) -> dict | None:
    """
    How a queued reservation's place and expected wait moved (a sample every
    MERIDIAN_HISTORY_SAMPLE_SECONDS): two line charts and the latest samples as a table; None
    before the first sample.
    """
    samples = history.queue_history(reservation)
    if not samples:
        return None
    labels = time_labels([s.at for s in samples])
    positions = [float(s.position) for s in samples]
    charts = {"position": line_chart({"Place": positions}, x_labels=labels, x_total=len(samples),
                                     top=round_up(max(positions)), label="Place in the queue over time")}
    waits = [(s.estimated_start - s.at).total_seconds() / 3600 if s.estimated_start else None for s in samples]
    if None not in waits:  # a sample with no estimate (current work never frees enough) has no point to draw
        waits = [max(0.0, w) for w in waits]
        charts["wait"] = line_chart({"Expected wait": waits}, x_labels=labels, x_total=len(samples),
                                    top=round_up(max(waits)), label="Expected wait in hours over time")
    return {**charts, "rows": samples[::-1][:QUEUE_ROWS_SHOWN], "count": len(samples)}


@console_page("instances", action="console")
def instance_console(request, pk):
    """An instance's boot log (its serial console's last bytes), as the API's console action gives it."""
    instance = scoped_or_404(request, Instance.objects.select_related("node__region", "reservation"), pk=pk)
    try:
        output, truncated = services.instance_console(instance=instance)
        unavailable = ""
    except DomainError as exc:
        output, truncated, unavailable = "", False, error_text(exc)
    return render(request, "provisioning/instance_console.html", {
        "instance": instance, "reservation": instance.reservation, "output": output, "truncated": truncated,
        "unavailable": unavailable})


@console_page("reservations")
def reservation_progress(request, pk):
    """The live part of a reservation's page, polled by htmx every two seconds while it moves."""
    reservation = scoped_or_404(request, Reservation.objects.select_related("offering", "region"), pk=pk)
    if request.htmx and request.GET.get("shown") not in (None, reservation.state):
        # The state moved since the page was drawn: redraw the whole page once, so its instances,
        # allocation and receipts (which only change with the state) are current too.
        response = HttpResponse(status=204)
        response["HX-Refresh"] = "true"
        return response
    context = {"reservation": reservation, **_progress_context(reservation)}
    return render(request, "provisioning/_progress.html", context)


@require_POST
@console_page("reservations")
def reservation_act(request, pk, verb):
    reservation = scoped_or_404(request, Reservation, action=CHANGE, pk=pk)
    try:
        if verb == "cancel":
            reservation = services.reservation_cancel(actor=request.principal, reservation=reservation)
        elif verb == "release":
            reservation = services.reservation_release(actor=request.principal, reservation=reservation)
        elif verb == "extend":
            hours = _positive_hours(request.POST.get("hours", ""))
            reservation = services.reservation_extend(actor=request.principal, reservation=reservation,
                                                      by=timedelta(hours=hours))
        else:
            raise Http404("No such action.")
    except DomainError as exc:
        messages.error(request, error_text(exc))
    else:
        messages.success(request, f"{reservation.name}: {verb} done; it is {reservation.get_state_display().lower()}.")
    return redirect("reservation-detail", pk=pk)


def _progress_context(reservation: Reservation) -> dict:
    now = timezone.now()
    progress = progress_of(reservation, now)
    operation = progress.operation
    return {"progress": progress, "now": now,
            "live": reservation.state in LIVE_STATES or (operation is not None and not operation.is_finished)}


def _score_only(reservation: Reservation) -> dict:
    """Past the queue the score is history: its factors, without position or estimate (no queries)."""
    breakdown = reservation.score_breakdown or {}
    return {"total": reservation.score, "factors": breakdown.get("factors", []), "queue_position": None,
            "adjustment": reservation.priority_adjustment, "held": False,
            "waiting_reason": "", "estimated_start": reservation.starts_at}


def _positive_hours(value: str) -> float:
    try:
        hours = float(value)
    except ValueError:
        raise DomainError("Give the extra time in hours, e.g. 2 or 0.5.", code="invalid") from None
    if not 0 < hours <= 24 * 366:
        raise DomainError("The extra time must be more than 0 and at most 8,784 hours.", code="invalid")
    return hours
