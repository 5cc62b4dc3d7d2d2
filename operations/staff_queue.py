"""
The staff queue: queued reservations ranked by score with every factor's contribution and the
reason each waits, the scheduler's last cycle, and what platform admins may do to one
reservation from there (``provisioning.staff_actions``: raise or lower its priority, hold it or
let it go, cancel it, contact its team), each with a note, audited.
"""

from __future__ import annotations

from datetime import timedelta
from uuid import UUID

from django.conf import settings
from django.contrib import messages
from django.core.paginator import Paginator
from django.db.models import Count, F, Q, Sum
from django.http import Http404
from django.shortcuts import redirect, render
from django.template.backends.utils import csrf_input
from django.urls import reverse
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST

from core.errors import DomainError
from provisioning import staff_actions
from provisioning.choices import ReservationState as R
from provisioning.models import Reservation
from provisioning.scheduling.scheduler import last_cycle
from provisioning.services import weights
from web.console import CHANGE, console_page, error_text, may, scoped, scoped_or_404

# The score's factors in ScoreBreakdown's order (provisioning.scheduling.priority.score), with their labels.
FACTORS = [("urgency", "Urgency"), ("fulfilment", "Fulfilment"), ("load", "Team load"), ("age", "Age"),
           ("high_priority", "High priority"), ("fair_share", "Fair share")]
PAGE_SIZES = [50, 100, 250, 500]
PLACEHOLDER = UUID(int=0)


@console_page("reservations", platform=True)
def queue(request):
    """Queued reservations ranked by score, every factor's contribution in a column; the last cycle."""
    per_page = _int(request.GET.get("per_page"), default=100)
    per_page = per_page if per_page in PAGE_SIZES else 100
    queued = scoped(request, Reservation).filter(state=R.QUEUED)
    totals = queued.aggregate(n=Count("pk"), gpus=Sum("gpus"), held=Count("pk", filter=Q(held_at__isnull=False)))
    paginator = Paginator(queued.select_related("tenant", "team", "offering")
                          .order_by(F("held_at").asc(nulls_first=True), "-score", "submitted_at", "pk"), per_page)
    paginator.count = totals["n"]  # counted already, with the GPUs
    page = paginator.get_page(request.GET.get("page"))
    now = timezone.now()
    can_act = may(request.principal, "queue")
    # Each row's action URLs from one reverse per verb: reversing (and a CSRF tag) per form was
    # a third of this page's time with a hundred rows.
    urls = {verb.replace("-", "_"): reverse("staff-queue-act", args=[PLACEHOLDER, verb]) for verb in QUEUE_ACTIONS}
    rows = []
    for rank, reservation in enumerate(page, start=page.start_index()):
        factors = {f.get("name"): f for f in (reservation.score_breakdown or {}).get("factors", [])}
        rows.append({"rank": rank, "r": reservation, "factors": [factors.get(name) for name, _ in FACTORS],
                     "waited": now - reservation.submitted_at,
                     "act": {verb: url.replace(str(PLACEHOLDER), str(reservation.pk)) for verb, url in urls.items()}
                     if can_act else None})
    w = weights()
    return render(request, "staff/queue.html", {
        "page": page,
        "rows": rows,
        "totals": totals,
        "per_page": per_page,
        "page_sizes": PAGE_SIZES,
        # The fair-share weight is a penalty's: shown negated, as the breakdown carries it.
        "factors": [(name, label, -w.fair_share if name == "fair_share" else getattr(w, name))
                    for name, label in FACTORS],
        "cycle": last_cycle_report(now),
        "can_act": can_act,
        "csrf_field": csrf_input(request),
        "here": request.get_full_path(),
    })


def _adjust(request, reservation):
    try:
        adjustment = float(request.POST.get("adjustment", ""))
    except ValueError:
        adjustment = float("nan")  # refused by the service, with what to give
    staff_actions.reservation_adjust_priority(actor=request.principal, reservation=reservation,
                                              adjustment=adjustment, note=request.POST.get("note", ""))
    return (f"{reservation.name}: priority adjustment {adjustment:+.2f} saved; "
            "the scheduler ranks it so from its next cycle.")


def _hold(request, reservation):
    staff_actions.reservation_hold(actor=request.principal, reservation=reservation, note=request.POST.get("note", ""))
    return f"{reservation.name} is held: no cycle places it until you let it go."


def _let_go(request, reservation):
    staff_actions.reservation_let_go(actor=request.principal, reservation=reservation,
                                     note=request.POST.get("note", ""))
    return f"{reservation.name} is back in the queue."


def _cancel(request, reservation):
    staff_actions.reservation_staff_cancel(actor=request.principal, reservation=reservation,
                                           reason=request.POST.get("reason", ""))
    return f"{reservation.name} was cancelled; its team was told why."


def _contact(request, reservation):
    staff_actions.reservation_contact(actor=request.principal, reservation=reservation,
                                      message=request.POST.get("message", ""))
    return f"Your message about {reservation.name} was sent to {_audience(reservation)}."


def _audience(reservation) -> str:
    return f"team {reservation.team.name}" if reservation.team else f"everyone at {reservation.tenant.name}"


QUEUE_ACTIONS = {"priority": _adjust, "hold": _hold, "let-go": _let_go, "cancel": _cancel, "contact": _contact}


@console_page("queue", platform=True)
@require_POST
def queue_act(request, pk, verb: str):
    """One of QUEUE_ACTIONS on one reservation (platform admins); back to where the form was, with the outcome."""
    act = QUEUE_ACTIONS.get(verb)
    if act is None:
        raise Http404("No such action.")
    reservation = scoped_or_404(request, Reservation.objects.select_related("tenant", "team"), CHANGE, pk=pk)
    try:
        messages.success(request, act(request, reservation))
    except DomainError as exc:
        messages.error(request, f"{reservation.name}: {error_text(exc)}")
    back = request.POST.get("next", "")
    if not url_has_allowed_host_and_scheme(back, allowed_hosts={request.get_host()}, require_https=request.is_secure()):
        back = reverse("staff-queue")
    return redirect(back)


def _int(value, *, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def last_cycle_report(now) -> dict | None:
    """The scheduler's last cycle as it stored it, with its age; None before the first cycle."""
    report = last_cycle()
    if not report:
        return None
    finished = parse_datetime(report.get("finished_at") or "")
    stale_after = timedelta(seconds=max(10.0, 20 * settings.MERIDIAN_SCHEDULER_INTERVAL))
    return {**report, "finished": finished, "stale": finished is None or now - finished > stale_after,
            "stale_after": int(stale_after.total_seconds()),
            "timings": sorted((report.get("timings_ms") or {}).items()),
            "total_ms": sum((report.get("timings_ms") or {}).values())}
