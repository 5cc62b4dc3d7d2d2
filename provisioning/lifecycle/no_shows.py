"""
No-shows and late releases give capacity back (issue 9 part 6; DESIGN.md "Priority": the team's
record). Reserved GPUs that nobody uses, and GPUs held past a reservation's end, are taken back,
by each offering's policy (``Offering.no_show_grace_minutes``, ``no_show_warning_minutes``,
``release_grace_minutes``), and only with evidence the tenant can read first.

**No-show.** An active reservation whose every GPU was idle -- no process and 0 % utilization --
from the start of use (its start, or when it became active if later) for the offering's grace is
warned once: an in-app notification to its tenant (its team), an audit event
``reservation.no_show_warning`` holding the evidence and the time it will be released (the
warning's record, read back by ``usage_warning`` for the API and the console). When the warning
period is over and the GPUs are still idle it is released as a no-show
(``release.reservation_no_show``: state ``no_show``, capacity given back, the GPUs cleaned like
any release); that counts against the team's fulfilment rate (provisioning.scheduling.team_record), so it
moves the priority score and high-priority eligibility. Any activity after the warning cancels it
(``reservation.no_show_cleared``, the tenant is told) and the reservation is never warned again.

**Late release.** A provisioning or active reservation still holding its GPUs past its end plus
the offering's release grace (the lifecycle tick expires reservations at their end; this is the
backstop when it did not) is reclaimed (``release.reservation_reclaim``): released now, so
``released_at - ends_at`` is the release delay that feeds the team's record
(provisioning.high_priority.services), and the tenant is told with the evidence.

**Evidence** (``usage_evidence``), per GPU, from the telemetry (cloud.telemetry):

- the node agent (NVML): every sample of the 1-minute rollups in the window had 0 % and no
  process (``idle_samples == samples``), and so does the latest sample;
- the BMC, for bare metal a tenant holds (no agent runs there): the GPU's power where the BMC
  reports it per GPU, at or below the GPU's *idle power* in every reading; where it reports only
  the chassis draw, the node's latest reading at or below the node's idle power with the BMC
  read throughout the window (the warning period is then watched at every scan, a minute apart).

*Idle power* of a GPU: ``MERIDIAN_IDLE_POWER_W`` (watts per GPU model slug, or one number for
every model), else ``MERIDIAN_IDLE_POWER_FRACTION`` (0.2) of the model's TDP -- an H100 SXM (700 W)
idles at 60-100 W and draws several hundred under any kernel. A chassis is idle at or below
``MERIDIAN_IDLE_NODE_BASE_W`` (CPUs, fans, NICs, drives; 1500 W) plus its GPUs' idle power.

No telemetry is no evidence: a GPU with telemetry for less than ``MIN_COVERAGE`` of the window's
minutes, or whose latest sample is older than ``FRESH``, is "unknown", and a reservation is
released only when every GPU is "idle". One sign of use ("used") decides at once.

The scan is idempotent and safe to run twice at once: each reservation is judged under its row
lock, and its warning (the audit trail) is read again under that lock, so it is warned once.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Count, F, Max, Q, Sum
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from cloud.choices import OfferingKind
from cloud.models import GPUSampleRollup, GPUTelemetry, NodeBMCReading, RollupPeriod
from provisioning.choices import ReservationState as R
from provisioning.lifecycle import release as releasing
from provisioning.models import Allocation, Reservation
from security.audit import audit_record
from security.models import AuditEvent
from tenants.notifications import notify

log = logging.getLogger(__name__)
WARNING = "reservation.no_show_warning"
CLEARED = "reservation.no_show_cleared"
NO_SHOW = "reservation.no_show"
RECLAIMED = "reservation.reclaim"
RESERVATION = Reservation._meta.label_lower
IDLE, USED, UNKNOWN = "idle", "used", "unknown"
MIN_COVERAGE = 0.8  # share of the window's minutes a GPU must have telemetry for to be judged idle
FRESH = timedelta(minutes=3)  # a latest sample older than this says nothing about now
# Past its start of use plus the grace, a reservation never judged idle is no longer looked at
# (telemetry that was missing then does not come back), nor a warning without evidence after it.
JUDGE_WINDOW = timedelta(hours=1)
# The longest grace plus the longest warning period an offering may set (Offering's validators).
LONGEST_POLICY = timedelta(minutes=240 + 240)
RECLAIMABLE = (R.PROVISIONING, R.ACTIVE)


@dataclass(frozen=True)
class Policy:
    """An offering's usage policy (``Offering``'s three fields)."""
    grace: timedelta
    warning: timedelta
    release_grace: timedelta

    @classmethod
    def of(cls, offering) -> Policy:
        return cls(grace=timedelta(minutes=offering.no_show_grace_minutes),
                   warning=timedelta(minutes=offering.no_show_warning_minutes),
                   release_grace=timedelta(minutes=offering.release_grace_minutes))

    @property
    def no_shows(self) -> bool:
        return self.grace > timedelta(0)

    def as_dict(self) -> dict:
        return {"no_show_grace_minutes": int(self.grace.total_seconds() // 60),
                "no_show_warning_minutes": int(self.warning.total_seconds() // 60),
                "release_grace_minutes": int(self.release_grace.total_seconds() // 60)}


def idle_power_w(gpu_model) -> float:
    """The power at or below which a GPU of ``gpu_model`` counts as idle (module docstring)."""
    configured = settings.MERIDIAN_IDLE_POWER_W
    if isinstance(configured, int | float) and not isinstance(configured, bool):
        return float(configured)
    if isinstance(configured, dict) and gpu_model.slug in configured:
        return float(configured[gpu_model.slug])
    return gpu_model.tdp_watts * settings.MERIDIAN_IDLE_POWER_FRACTION


def node_idle_power_w(gpu_idle_w: float, gpus: int) -> float:
    return settings.MERIDIAN_IDLE_NODE_BASE_W + gpus * gpu_idle_w


#
# Judging (pure)
#


@dataclass(frozen=True)
class Minutes:
    """One GPU's 1-minute rollups over the window, summed (cloud.models.GPUSampleRollup)."""
    buckets: int = 0
    samples: int = 0
    idle_samples: int = 0
    utilization_samples: int = 0
    power_samples: int = 0
    power_max: float | None = None
    power_idle_buckets: int = 0


@dataclass(frozen=True)
class Latest:
    """A GPU's latest sample (cloud.models.GPUTelemetry)."""
    source: str
    sampled_at: datetime
    utilization_pct: int | None = None
    processes: int | None = None
    power_w: float | None = None


def latest_verdict(latest: Latest | None, *, idle_w: float, chassis_idle: bool | None) -> str:
    """What the latest sample says now: NVML's utilization and processes, else GPU power, else the chassis."""
    if latest is not None and latest.utilization_pct is not None:
        return IDLE if latest.utilization_pct == 0 and not latest.processes else USED
    if latest is not None and latest.power_w is not None:
        return IDLE if latest.power_w <= idle_w else USED
    if chassis_idle is not None:
        return IDLE if chassis_idle else USED
    return UNKNOWN


def gpu_verdict(minutes: Minutes, latest: Latest | None, *, idle_w: float, chassis_idle: bool | None,
                needed: int, fresh_after: datetime) -> str:
    """
    ``used`` on any sign of use in the window or now; ``idle`` when every reading of at least
    ``needed`` minutes and a fresh latest sample say idle; ``unknown`` otherwise (no evidence).
    ``chassis_idle``: the node's fresh BMC chassis reading is at idle power (None: none).
    """
    if minutes.utilization_samples > minutes.idle_samples:
        return USED  # a sample with a process or above 0 %
    if not minutes.utilization_samples and minutes.power_max is not None and minutes.power_max > idle_w:
        return USED  # the BMC's GPU power above idle
    fresh = latest is not None and latest.sampled_at >= fresh_after
    now = latest_verdict(latest if fresh else None, idle_w=idle_w, chassis_idle=chassis_idle)
    if now == USED:
        return USED
    if now != IDLE or minutes.buckets < needed:
        return UNKNOWN
    if minutes.utilization_samples:  # the agent: every sample 0 % and no process
        return IDLE if minutes.idle_samples == minutes.samples else UNKNOWN
    if minutes.power_samples:  # the BMC's GPU power sensors: every reading
        return IDLE if minutes.power_samples == minutes.samples else UNKNOWN
    return IDLE if chassis_idle else UNKNOWN  # the chassis draw only (the BMC read it throughout)


def judge(verdicts: list[str]) -> str:
    """The reservation's verdict: used if any GPU was used, idle if every GPU was, else unknown."""
    if USED in verdicts:
        return USED
    return IDLE if verdicts and all(v == IDLE for v in verdicts) else UNKNOWN


def needed_minutes(since: datetime, until: datetime) -> tuple[int, int]:
    """The whole minutes of ``[since, until)`` and how many of them must have telemetry."""
    expected = max(0, int((until - _ceil_minute(since)).total_seconds() // 60))
    return expected, max(1, math.ceil(expected * MIN_COVERAGE))


def _ceil_minute(moment: datetime) -> datetime:
    floor = moment.replace(second=0, microsecond=0)
    return floor if floor == moment else floor + timedelta(minutes=1)


#
# Reading the evidence
#


def start_of_use(reservation: Reservation) -> datetime | None:
    """When the tenant could first use the GPUs: its start, or when it became active if that was later."""
    if reservation.starts_at is None:
        return None
    if reservation.state == R.ACTIVE and reservation.state_changed_at > reservation.starts_at:
        return reservation.state_changed_at
    return reservation.starts_at


def usage_evidence(reservation: Reservation, *, now: datetime | None = None, since: datetime | None = None) -> dict:
    """
    The reservation's GPUs over ``[since, now)`` (default: from its start of use), JSON-ready:
    per GPU its latest sample (the process count left out on a GPU shared by slots, as
    provisioning.telemetry.reservation_telemetry does), the minutes with telemetry, the idle fraction of
    its samples and its verdict; for bare metal the nodes' BMC chassis readings; and the
    reservation's verdict. Four or five queries, whatever the GPU count.
    """
    now = now or timezone.now()
    until = now if reservation.released_at is None else min(now, reservation.released_at)
    since = since or start_of_use(reservation) or now
    expected, needed = needed_minutes(since, until)
    idle_w = idle_power_w(reservation.gpu_model)
    shared = reservation.offering.slots_per_gpu > 1
    bare_metal = reservation.offering.kind == OfferingKind.BARE_METAL
    gpus = {}  # GPU id -> (uuid, node id, hostname)
    for gpu_id, uuid, node_id, hostname in (
            Allocation.objects.filter(reservation=reservation, starts_at__lte=until, ends_at__gte=since)
            .order_by("gpu__node__hostname", "gpu__index").values_list("gpu_id", "gpu__uuid", "node_id",
                                                                       "node__hostname")):
        gpus.setdefault(gpu_id, (uuid, node_id, hostname))
    latest, minutes, chassis = {}, {}, {}
    if gpus:
        latest = {row.gpu_id: row for row in GPUTelemetry.objects.filter(gpu_id__in=list(gpus))}
        for gpu_id, *sums in (
                GPUSampleRollup.objects.filter(gpu_id__in=list(gpus), period=RollupPeriod.MINUTE,
                                               bucket__gte=_ceil_minute(since), bucket__lt=until)
                .order_by().values_list("gpu_id")
                .annotate(b=Count("pk"), s=Sum("samples"), i=Sum("idle_samples"), u=Sum("utilization_samples"),
                          p=Sum("power_samples"), pm=Max("power_max"),
                          pi=Count("pk", filter=Q(power_samples=F("samples"), power_max__lte=idle_w)))):
            minutes[gpu_id] = Minutes(*(value or 0 for value in sums[:5]), sums[5], sums[6] or 0)
        if bare_metal:
            chassis = {row.node_id: row for row in NodeBMCReading.objects.filter(
                node_id__in={node_id for _, node_id, _ in gpus.values()})}
    fresh_after = until - FRESH
    gpus_per_node: dict = {}
    for _, node_id, _ in gpus.values():
        gpus_per_node[node_id] = gpus_per_node.get(node_id, 0) + 1
    nodes = []
    chassis_idle = {}
    for node_id, reading in chassis.items():
        if not _while_held(reading.read_at, since, reservation.released_at):
            continue  # read before its use began, or after it ended: another tenant's server then
        node_w = node_idle_power_w(idle_w, gpus_per_node.get(node_id, 0))
        fresh = reading.read_at >= fresh_after and reading.power_w is not None
        chassis_idle[node_id] = (reading.power_w <= node_w) if fresh else None
        hostname = next(h for _, n, h in gpus.values() if n == node_id)
        nodes.append({"name": hostname, "read_at": _iso(reading.read_at), "power_w": reading.power_w,
                      "idle_power_w": node_w, "verdict": {True: IDLE, False: USED, None: UNKNOWN}[
                          chassis_idle[node_id]]})
    rows, verdicts = [], []
    for gpu_id, (uuid, node_id, _) in gpus.items():
        row = latest.get(gpu_id)
        # Only a sample taken while the GPU was this reservation's: after its release the GPU (and
        # its latest sample) may be another tenant's.
        sample = None if row is None or not _while_held(row.sampled_at, since, reservation.released_at) else Latest(
            source=row.source, sampled_at=row.sampled_at, utilization_pct=row.utilization_pct,
            processes=row.processes, power_w=row.power_w)
        window = minutes.get(gpu_id, Minutes())
        verdict = gpu_verdict(window, sample, idle_w=idle_w, chassis_idle=chassis_idle.get(node_id), needed=needed,
                              fresh_after=fresh_after)
        verdicts.append(verdict)
        if window.utilization_samples:
            fraction = round(window.idle_samples / window.samples, 4)
        elif window.power_samples:
            fraction = round(window.power_idle_buckets / window.buckets, 4)
        else:
            fraction = None
        rows.append({
            "uuid": uuid, "source": sample.source if sample else None,
            "sampled_at": _iso(sample.sampled_at) if sample else None,
            "utilization_pct": sample.utilization_pct if sample else None,
            "processes": None if sample is None or shared else sample.processes,
            "power_w": sample.power_w if sample else None, "idle_power_w": idle_w,
            "minutes": window.buckets, "samples": window.samples, "idle_samples": window.idle_samples,
            "idle_fraction": fraction, "verdict": verdict,
        })
    return {"since": _iso(since), "until": _iso(until), "minutes": expected, "needed_minutes": needed,
            "verdict": judge(verdicts), "gpus": rows, "nodes": nodes}


def _while_held(moment: datetime, since: datetime, released_at: datetime | None) -> bool:
    """Taken while the reservation held its hardware (a live one: any time from its start of use)."""
    return since <= moment and (released_at is None or moment <= released_at)


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()


def _last_warning_event(reservation: Reservation):
    """The reservation's latest no-show warning or its clearing (the audit trail), or None."""
    return (AuditEvent.objects.filter(action__in=(WARNING, CLEARED), target_type=RESERVATION,
                                      target_id=str(reservation.pk))
            .order_by("-id").only("action", "after", "occurred_at").first())


def usage_warning(reservation: Reservation) -> dict | None:
    """
    The reservation's no-show warning as the tenant reads it, or None if it never had one:
    ``status`` pending (it will be released at ``release_at`` if still idle), cleared (use came
    after it, or the evidence stopped) or released (it ended a no-show); with the evidence it
    was warned on. One query.
    """
    event = _last_warning_event(reservation)
    if event is None:
        return None
    after = event.after or {}
    if event.action == CLEARED:
        status = "cleared"
    elif reservation.state == R.NO_SHOW:
        status = "released"
    elif reservation.state == R.ACTIVE:
        status = "pending"
    else:
        status = "cleared"  # it ended otherwise (released by the tenant, expired)
    return {"status": status, "warned_at": after.get("warned_at"), "release_at": after.get("release_at"),
            "cleared_at": after.get("cleared_at"), "reason": after.get("reason", ""),
            "evidence": after.get("evidence")}


def usage_report(reservation: Reservation, *, now: datetime | None = None) -> dict:
    """What ``GET /reservations/{id}/usage/`` answers: the policy, the evidence, any warning or overdue end."""
    now = now or timezone.now()
    policy = Policy.of(reservation.offering)
    late = None
    if reservation.state in RECLAIMABLE and reservation.ends_at is not None and reservation.ends_at <= now:
        late = {"ended_at": _iso(reservation.ends_at), "reclaim_at": _iso(reservation.ends_at + policy.release_grace),
                "overdue_s": round((now - reservation.ends_at).total_seconds(), 3)}
    return {"reservation": str(reservation.pk), "state": reservation.state, "policy": policy.as_dict(),
            "evidence": usage_evidence(reservation, now=now), "warning": usage_warning(reservation),
            "late_release": late}


#
# The scan (beat, every minute)
#


def no_show_scan(*, now: datetime | None = None, limit: int = 500) -> dict:
    """
    Warn the active reservations idle since their start of use for their grace, release as
    no-shows those still idle after the warning period, clear warnings that use came after, and
    reclaim reservations holding GPUs past their end plus the release grace. Each reservation in
    its own transaction under its row lock; one that fails is logged, counted and left to the
    next scan. Returns what it did.
    """
    now = now or timezone.now()
    report = {"warned": 0, "cleared": 0, "no_shows": 0, "reclaimed": 0, "errors": 0}
    # Candidates only: each is judged again under its lock.
    judged = (Reservation.objects.filter(state=R.ACTIVE, state_changed_at__gte=now - LONGEST_POLICY - JUDGE_WINDOW,
                                         offering__no_show_grace_minutes__gt=0, managed_by="")
              .order_by("state_changed_at").values_list("pk", flat=True)[:limit])
    ended = (Reservation.objects.filter(state__in=RECLAIMABLE, ends_at__lte=now).order_by("ends_at")
             .values_list("pk", flat=True)[:limit])
    for act, pks in ((_judge, list(judged)), (_reclaim, list(ended))):
        for pk in pks:
            try:
                outcome = act(pk, now)
            except Exception:
                log.exception("no-show scan failed on reservation %s; the next scan tries again", pk)
                report["errors"] += 1
                continue
            if outcome:
                report[outcome] += 1
    return report


def _locked(pk, states) -> Reservation | None:
    return (Reservation.objects.select_for_update(of=("self",))
            .select_related("offering", "gpu_model", "tenant", "team").filter(pk=pk, state__in=states).first())


@transaction.atomic
def _judge(pk, now: datetime) -> str | None:
    reservation = _locked(pk, [R.ACTIVE])
    if reservation is None:
        return None
    policy, since = Policy.of(reservation.offering), start_of_use(reservation)
    if not policy.no_shows or since is None or now < since + policy.grace:
        return None
    event = _last_warning_event(reservation)
    if event is not None and event.action == CLEARED:
        return None  # warned once already, and it was used (or the evidence stopped): never again
    if event is None:
        if now >= since + policy.grace + JUDGE_WINDOW:
            return None
        evidence = usage_evidence(reservation, now=now)
        if evidence["verdict"] != IDLE:
            return None
        _warn(reservation, evidence, now=now, release_at=now + policy.warning)
        return "warned"
    warning = event.after or {}
    evidence = usage_evidence(reservation, now=now)
    release_at = parse_datetime(warning.get("release_at") or "") or now
    if evidence["verdict"] == USED:
        _clear(reservation, evidence, now=now, reason="The GPUs were used after the warning.")
        return "cleared"
    if now < release_at:
        return None
    if evidence["verdict"] == IDLE:
        releasing.reservation_no_show(reservation=reservation, evidence=evidence, warned_at=warning.get("warned_at"))
        _notify(reservation, NO_SHOW,
                title=f"{reservation.name} was released as a no-show",
                body=(f"Its {_gpu_count(evidence)} GPUs showed no process and 0 % utilization from "
                      f"{_hm(evidence['since'])} to {_hm(evidence['until'])} UTC, through the warning sent at "
                      f"{_hm(warning.get('warned_at'))}. They were released and are being cleaned; the reservation "
                      f"counts as not used in your team's record. Evidence: {_summary(evidence)}."))
        return "no_shows"
    if now >= release_at + JUDGE_WINDOW:
        _clear(reservation, evidence, now=now,
               reason="The telemetry stopped; nothing is released without evidence.")
        return "cleared"
    return None  # no evidence right now: wait for it, never release without it


def _warn(reservation: Reservation, evidence: dict, *, now: datetime, release_at: datetime) -> None:
    audit_record(actor=None, action=WARNING, target=reservation,
                 after={"warned_at": _iso(now), "release_at": _iso(release_at), "evidence": evidence})
    _notify(reservation, WARNING,
            title=f"{reservation.name} will be released as a no-show at {release_at:%H:%M} UTC",
            body=(f"Its {_gpu_count(evidence)} GPUs have shown no process and 0 % utilization since "
                  f"{_hm(evidence['since'])} UTC. Unless they are used, the reservation is released as a no-show at "
                  f"{release_at:%Y-%m-%d %H:%M} UTC: its GPUs go back to the pool and it counts as not used in "
                  f"your team's record. Start your work on them, or release the reservation if you no longer need "
                  f"it. Evidence: {_summary(evidence)}."))


def _clear(reservation: Reservation, evidence: dict, *, now: datetime, reason: str) -> None:
    audit_record(actor=None, action=CLEARED, target=reservation,
                 after={"cleared_at": _iso(now), "reason": reason, "evidence": evidence})
    _notify(reservation, CLEARED, title=f"{reservation.name} will not be released as a no-show",
            body=f"{reason} The no-show warning is withdrawn; the reservation runs to its end.")


@transaction.atomic
def _reclaim(pk, now: datetime) -> str | None:
    reservation = _locked(pk, RECLAIMABLE)
    if reservation is None or reservation.ends_at is None:
        return None
    policy = Policy.of(reservation.offering)
    if now < reservation.ends_at + policy.release_grace:
        return None
    evidence = usage_evidence(reservation, now=now, since=reservation.ends_at)
    releasing.reservation_reclaim(reservation=reservation, evidence=evidence)
    delay_s = (reservation.released_at - reservation.ends_at).total_seconds()
    _notify(reservation, RECLAIMED,
            title=f"{reservation.name} was reclaimed {round(delay_s / 60)} minutes after its end",
            body=(f"It ended at {reservation.ends_at:%Y-%m-%d %H:%M} UTC and still held its GPUs past the "
                  f"{int(policy.release_grace.total_seconds() // 60)}-minute release grace; they were released at "
                  f"{reservation.released_at:%H:%M} UTC and are being cleaned. The {round(delay_s)} s counts as "
                  f"release delay in your team's record. Evidence since the end: {_summary(evidence)}."))
    return "reclaimed"


def _notify(reservation: Reservation, kind: str, *, title: str, body: str) -> None:
    notify(reservation.tenant, team=reservation.team, kind=kind, title=title, body=body,
           link=f"/reservations/{reservation.pk}/")


def _gpu_count(evidence: dict) -> int:
    return len(evidence["gpus"])


def _hm(moment: str | None) -> str:
    parsed = parse_datetime(moment or "")
    return f"{parsed:%H:%M}" if parsed else "-"


def _summary(evidence: dict) -> str:
    """One line per the evidence, for a notification: what each GPU (or chassis) showed."""
    parts = []
    for gpu in evidence["gpus"][:8]:
        if gpu["utilization_pct"] is not None:
            now = f"{gpu['utilization_pct']} %" + (f", {gpu['processes']} processes" if gpu["processes"] is not None
                                                    else "")
        elif gpu["power_w"] is not None:
            now = f"{gpu['power_w']:.0f} W (idle at or below {gpu['idle_power_w']:.0f} W)"
        else:
            now = "no reading"
        fraction = "" if gpu["idle_fraction"] is None else f", idle {gpu['idle_fraction']:.0%} of {gpu['minutes']} min"
        parts.append(f"{gpu['uuid']}: {now}{fraction}")
    parts += [f"{node['name']} chassis {node['power_w']} W (idle at or below {node['idle_power_w']:.0f} W)"
              for node in evidence["nodes"]]
    more = len(evidence["gpus"]) - 8
    return "; ".join(parts) + (f"; and {more} more GPUs" if more > 0 else "") if parts else "no telemetry"
