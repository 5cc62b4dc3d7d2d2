"""
Admission: the checks a reservation passes before it exists.

A request that can never fit is a 400 at once (more than the regions could ever hold, a window in
the past, a duration over the maximum, a spot price under the floor) rather than a reservation
that waits forever; over quota is a 409 with the numbers. Quotas are checked here at creation
and again when the scheduler places the reservation.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.db import connection
from django.db.models import Case, Count, DateTimeField, ExpressionWrapper, F, FloatField, Q, Sum, Value, When
from django.db.models.functions import Cast

from cloud.choices import OfferingKind, pool_of
from cloud.models import GPU, GPUModel, Offering, Region
from core.errors import DomainError, invalid
from provisioning.capacity import SELLABLE_HEALTH
from provisioning.choices import BillingTerm
from provisioning.models import Reservation
from provisioning.transitions import QUOTA_STATES, WAITING_STATES
from tenants.choices import QuotaResource
from tenants.quotas import QuotaLimit, quota_check, quota_limits, quota_limits_many


@dataclass(frozen=True)
class Ask:
    """A validated reservation request, before admission."""

    name: str
    offering: Offering
    units: int
    regions: tuple[Region, ...]
    duration: timedelta
    requested_start: datetime | None = None
    billing_term: str = BillingTerm.ON_DEMAND
    committed: bool = False  # a commitment's capacity (billing.commitments): may last its whole term
    spot_max_price: Decimal | None = None
    eviction_policy: str = "soft"
    urgency: float = 0.5
    ssh_public_key: str = ""
    ssh_keys: tuple = ()  # saved keys (tenants.SSHKey) the principal can see
    image: object | None = None  # a cloud.Image the principal can see; None: the default of the kind
    public_ip: bool = False
    user_data: str = ""  # checked cloud-init user-data (provisioning.cloud_init.user_data_check)
    environment: tuple = ()  # (name, value) pairs for a container's environment (environment_check)
    spec: dict | None = None
    vpc: object | None = None  # a VPC the principal can see (checked against team and regions at admission)
    managed_by: str = ""  # a Meridian service running it for the tenant (Reservation.managed_by)

    @property
    def gpus(self) -> int:
        """Whole GPUs held; a fractional ask holds slots, counted as GPU shares for quotas."""
        return self.units * self.offering.gpus_per_unit if self.offering.slots_per_gpu == 1 else 0

    @property
    def gpu_equivalent(self) -> float:
        if self.offering.slots_per_gpu == 1:
            return float(self.gpus)
        return self.units / self.offering.slots_per_gpu


ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
MAX_ENV_VARS = 64
MAX_ENV_BYTES = 32_768


def environment_check(environment: dict, offering: Offering) -> dict:
    """
    A container's environment variables: names as a shell takes them (not MERIDIAN_*, which are
    Meridian's own), string values, at most 64 of them and 32 KiB in all (a Secret holds 1 MiB);
    servers and VMs take theirs through user-data instead.
    """
    if not environment:
        return {}
    if offering.kind != OfferingKind.CONTAINER:
        raise invalid("environment", f"{offering.slug} is a {offering.get_kind_display().lower()} offering: "
                      "environment applies to containers; set variables through user_data instead.",
                      code="not_container")
    if len(environment) > MAX_ENV_VARS:
        raise invalid("environment", f"{len(environment)} variables; the limit is {MAX_ENV_VARS}.", code="too_many")
    for name, value in environment.items():
        if not ENV_NAME.match(name):
            raise invalid("environment", f"'{name[:64]}' is not a variable name (letters, digits and '_', not "
                          "starting with a digit).", code="invalid_name")
        if name.upper().startswith("MERIDIAN_") or name == "SSH_PUBLIC_KEY":
            raise invalid("environment", f"{name} is set by Meridian; choose another name.", code="reserved_name")
        if not isinstance(value, str) or "\x00" in value:
            raise invalid("environment", f"{name}: values are text without NUL bytes.", code="invalid_value")
    size = sum(len(name) + len(value.encode()) for name, value in environment.items())
    if size > MAX_ENV_BYTES:
        raise invalid("environment", f"The variables hold {size:,} bytes; the limit is {MAX_ENV_BYTES:,}.",
                      code="too_large")
    return dict(environment)


def count_field(offering: Offering) -> str:
    """The request's count field of ``offering``: bare metal is sold by nodes, fractional GPUs by slots, else gpus."""
    if offering.kind == OfferingKind.BARE_METAL:
        return "nodes"
    return "slots" if offering.slots_per_gpu > 1 else "gpus"


def best_offering_for_spec(*, kind: str, min_fp16_tflops: float, min_memory_gib: int) -> Offering:
    """
    The offering of ``kind`` on the best-fitting GPU model for a logical spec: the smallest model
    (least memory, then least compute) that meets both minimums, then the cheapest offering.
    """
    models = GPUModel.objects.filter(fp16_tflops__gte=min_fp16_tflops, memory_gib__gte=min_memory_gib)
    offering = (
        Offering.objects.filter(kind=kind, is_active=True, gpu_model__in=models, slots_per_gpu=1)
        .select_related("gpu_model")
        .order_by("gpu_model__memory_gib", "gpu_model__fp16_tflops", "price_per_gpu_hour", "gpus_per_unit")
        .first()
    )
    if offering is None:
        raise invalid("spec", f"No {kind} offering has a GPU with {min_fp16_tflops} TFLOPS and {min_memory_gib} GiB.",
                      code="no_matching_offering")
    return offering


def check_never_fits(ask: Ask, now: datetime) -> None:
    """400 for a request that could never be served, naming what to change."""
    offering = ask.offering
    if not offering.is_active:
        raise invalid("offering", "This offering is no longer sold.")
    if ask.duration <= timedelta(0):
        raise invalid("duration_hours", "The duration must be positive.")
    if ask.duration > settings.MERIDIAN_MAX_RESERVATION_DURATION and not ask.committed:
        raise invalid("duration_hours", f"A reservation lasts at most {settings.MERIDIAN_MAX_RESERVATION_DURATION.days}"
                                        " days; split it, or make a commitment (1 to 36 months) for longer.",
                      code="duration_too_long")
    if ask.requested_start is not None:
        if ask.requested_start < now - settings.MERIDIAN_START_SKEW:
            raise invalid("start", "The window starts in the past.", code="start_in_past")
        if ask.requested_start > now + settings.MERIDIAN_MAX_ADVANCE:
            raise invalid("start", f"A window may start at most {settings.MERIDIAN_MAX_ADVANCE.days} days ahead.")
    if ask.billing_term == BillingTerm.SPOT:
        if not offering.spot_available:
            raise invalid("billing_term", f"{offering.slug} has no spot variant.")
        if ask.spot_max_price is None:
            raise invalid("spot_max_price", "A spot reservation needs a max price per GPU-hour.")
        if ask.spot_max_price < offering.spot_floor_price:
            raise invalid("spot_max_price", f"The spot floor of {offering.slug} is {offering.spot_floor_price} "
                                            "per GPU-hour.", code="below_spot_floor")
    elif ask.spot_max_price is not None:
        raise invalid("spot_max_price", "Only spot reservations take a max price.")
    if ask.vpc is not None:
        check_vpc(ask)
    largest = REGION_SIZES.largest(offering, ask.regions, at_least=ask.gpu_equivalent)
    if largest == 0:
        raise not_sold_in(offering, ask.regions)
    if largest < ask.gpu_equivalent:
        field = count_field(offering)
        asked = f"{ask.gpu_equivalent:g} GPUs"
        if field != "gpus":
            asked = f"{ask.units} {field} ({asked})"
        raise invalid(field, f"Asked for {asked} of {offering.gpu_model.name}; the largest of the chosen regions has "
                             f"{largest} GPUs.", code="never_fits")


def not_sold_in(offering: Offering, regions) -> DomainError:
    """400 on ``regions``: none of them has sellable capacity of the offering; names those that have."""
    selling = sorted(set(
        GPU.objects.filter(model_id=offering.gpu_model_id, node__pool=pool_of(offering.kind), node__is_spare=False,
                           node__confidential=offering.confidential, health__in=SELLABLE_HEALTH,
                           node__region__is_active=True)
        .values_list("node__region__slug", flat=True).distinct()))
    where = (f"it is sold in {', '.join(selling)}." if selling else "it is sold in no region at the moment.")
    return invalid("regions", f"{offering.slug} is not sold in {', '.join(r.slug for r in regions)}; {where}",
                   code="not_sold_in_region")


def check_vpc(ask: Ask) -> None:
    """The VPC must be usable and in one of the regions asked (the reservation then goes only there)."""
    from provisioning.choices import VPCState

    vpc = ask.vpc
    if vpc.state in (VPCState.DELETING, VPCState.DELETED):
        raise invalid("vpc", f"VPC {vpc.name} is being deleted.", code="vpc_deleting")
    if vpc.fabric.region_id not in {region.pk for region in ask.regions}:
        raise invalid("vpc", f"VPC {vpc.name} is in {vpc.fabric.region.slug}, which is not among the regions "
                             "asked.", code="vpc_region")


class RegionSizes:
    """
    Per process: each region's sellable GPUs of a model in a pool, as counted at most ``ttl_s`` ago.
    Counting them is a scan of the region's GPUs on every create; the answer moves only when
    hardware is enrolled, fails or is retired. "Never fits" takes only a yes from memory: an ask a
    recent count says fits passes without counting (so in a region that shrank since, an ask
    may wait in the queue, for at most that long, instead of being refused); any other is counted
    again, so a 400 always comes from the fleet as it is now.
    """

    def __init__(self, ttl_s: float = 30.0):
        self.ttl_s = ttl_s
        self._lock = threading.Lock()
        self._counted: dict[tuple, tuple[float, int]] = {}  # (model, pool, region) -> (when, GPUs)

    def largest(self, offering: Offering, regions, *, at_least: float) -> int:
        """The most sellable GPUs of ``offering``'s kind in one of ``regions``: remembered when enough, else counted."""
        model, pool, now = offering.gpu_model_id, (pool_of(offering.kind), offering.confidential), time.monotonic()
        with self._lock:
            remembered = [self._counted.get((model, pool, region.pk)) for region in regions]
        largest = max((n for when, n in filter(None, remembered) if now - when <= self.ttl_s), default=0)
        if largest >= at_least:
            return largest
        counted = dict(
            GPU.objects.filter(model_id=model, node__pool=pool[0], node__confidential=pool[1], node__is_spare=False,
                               health__in=SELLABLE_HEALTH, node__region__in=list(regions))
            .values_list("node__region_id").annotate(n=Count("pk")))
        with self._lock:
            for region in regions:
                self._counted[(model, pool, region.pk)] = (now, counted.get(region.pk, 0))
        return max(counted.values(), default=0)

    def clear(self) -> None:
        with self._lock:
            self._counted.clear()


REGION_SIZES = RegionSizes()


def check_quota(*, tenant, team, ask: Ask, window_start: datetime, counted_already: bool = False) -> None:
    """
    409 when the ask would pass a tenant or team GPU quota over its window (waiting work counts).
    At placement the reservation is already among the waiting work (``counted_already``): the
    check then fails only if a quota was lowered below what is held and asked.
    """
    window_end = window_start + ask.duration
    asked = 0 if counted_already else ask.gpu_equivalent
    quota_check(tenant=tenant, team=team, resource=QuotaResource.GPUS, asked=asked,
                in_use=lambda limit: gpus_counted(tenant, team, limit, window_start, window_end),
                gpu_model=ask.offering.gpu_model_id)


def quota_headroom(*, tenant, team, ask: Ask, window_start: datetime) -> list[tuple[QuotaLimit, float]]:
    """Each GPU limit the ask falls under with what already counts against it over the ask's window."""
    window_end = window_start + ask.duration
    limits = quota_limits(tenant=tenant, resource=QuotaResource.GPUS, team=team, gpu_model=ask.offering.gpu_model_id)
    return [(limit, gpus_counted(tenant, team, limit, window_start, window_end)) for limit in limits]


def gpus_counted(tenant, team, limit: QuotaLimit, window_start: datetime, window_end: datetime) -> float:
    """GPUs (fractional slots as GPU shares) that count against ``limit`` over the window."""
    if connection.vendor == "postgresql":
        return _gpus_counted_postgresql(tenant, team, limit, window_start, window_end)
    return _gpus_counted_orm(tenant, team, limit, window_start, window_end)


def _gpus_counted_postgresql(tenant, team, limit: QuotaLimit, window_start: datetime, window_end: datetime) -> float:
    """
    ``_gpus_counted_orm`` as one written statement (tested equal): on every create, building the
    ORM's expressions cost twice what PostgreSQL takes to answer.
    """
    reservation, offering = Reservation._meta.db_table, Offering._meta.db_table
    column = "tenant_id" if limit.scope == "tenant" else "team_id"
    # Only table and column names are formatted in; every value is a parameter.
    sql = f"""
        SELECT SUM(r.gpus), SUM(r.units::float / o.slots_per_gpu) FILTER (WHERE r.gpus = 0)
        FROM {reservation} r JOIN {offering} o ON o.id = r.offering_id
        WHERE r.{column} = %(owner)s AND r.state = ANY(%(states)s)
          AND (%(model)s::uuid IS NULL OR r.gpu_model_id = %(model)s::uuid)
          AND ((r.starts_at < %(end)s AND r.ends_at > %(start)s)
               OR (r.starts_at IS NULL AND (r.requested_start IS NULL
                   OR (r.requested_start < %(end)s AND r.requested_start > %(start)s - r.duration))))
    """  # noqa: S608
    owner = tenant if limit.scope == "tenant" else team  # a model or its id (the scheduler passes ids)
    params = {"owner": getattr(owner, "pk", owner),
              "states": sorted(QUOTA_STATES | WAITING_STATES), "model": limit.gpu_model_id,
              "start": window_start, "end": window_end}
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        whole, slots = cursor.fetchone()
    return (whole or 0) + (slots or 0)


def _gpus_counted_orm(tenant, team, limit: QuotaLimit, window_start: datetime, window_end: datetime) -> float:
    owned = Q(tenant=tenant) if limit.scope == "tenant" else Q(team=team)
    reservations = Reservation.objects.filter(owned, state__in=QUOTA_STATES | WAITING_STATES)
    if limit.gpu_model_id:
        reservations = reservations.filter(gpu_model_id=limit.gpu_model_id)
    # Overlapping the window: placed ones by their window; waiting ones by the window they
    # asked for, or -- as soon as possible -- as if they started now.
    placed = Q(starts_at__lt=window_end, ends_at__gt=window_start)
    asked_start_floor = ExpressionWrapper(Value(window_start) - F("duration"), output_field=DateTimeField())
    asked_window = Q(requested_start__isnull=True) | Q(requested_start__lt=window_end,
                                                        requested_start__gt=asked_start_floor)
    waiting = asked_window & Q(starts_at__isnull=True)
    # One statement: whole GPUs summed; slots (gpus = 0) as their share of a GPU.
    slot_share = Cast("units", FloatField()) / F("offering__slots_per_gpu")
    counted = reservations.filter(placed | waiting).aggregate(
        whole=Sum("gpus"), slots=Sum(Case(When(gpus=0, then=slot_share), output_field=FloatField())))
    return (counted["whole"] or 0) + (counted["slots"] or 0)


def quota_suspects(owners) -> set[tuple]:
    """
    Of ``owners`` -- ``(tenant_id, team_id or None, gpu_model_id)`` -- those that may be over a
    GPU quota at placement: all their held and waiting work, whatever its window, passes a limit.
    Counting every window is never less than counting one, so the others surely pass
    ``check_quota(counted_already=True)`` and only these need it. Two queries for all owners.
    """
    owners = set(owners)
    tenant_ids = {tenant for tenant, _, _ in owners}
    counted = Reservation.objects.filter(tenant_id__in=tenant_ids, state__in=QUOTA_STATES | WAITING_STATES)
    totals = [
        (row["tenant_id"], row["team_id"], row["gpu_model_id"], (row["whole"] or 0) + (row["slots"] or 0))
        for row in counted.values("tenant_id", "team_id", "gpu_model_id").annotate(
            whole=Sum("gpus"),
            slots=Sum(Cast("units", FloatField()) / F("offering__slots_per_gpu"), filter=Q(gpus=0)),
        )
    ]
    limits_of = quota_limits_many(tenant_ids=tenant_ids, resource=QuotaResource.GPUS)
    suspects = set()
    for tenant, team, model in owners:
        for limit in limits_of(tenant, team, model):
            used = sum(n for t, tm, m, n in totals
                       if t == tenant and (limit.scope == "tenant" or tm == team)
                       and limit.gpu_model_id in (None, m))
            if used > limit.limit:
                suspects.add((tenant, team, model))
                break
    return suspects


# What the apps above provisioning check of new work besides quotas (billing: a spent budget with a
# hard stop, a spot max price below the market): registered when they load, run under the tenant lock.
ADMISSION: list[Callable[..., None]] = []


def admission_check(check: Callable[..., None]) -> Callable[..., None]:
    """Register ``check(tenant=, team=, ask=)``, which raises a DomainError to refuse new work (once)."""
    if check not in ADMISSION:
        ADMISSION.append(check)
    return check


def admission_checks(*, tenant, team, ask) -> None:
    """Run every registered check of new work (``ask``) by ``team`` of ``tenant`` (under the tenant's lock)."""
    for check in ADMISSION:
        check(tenant=tenant, team=team, ask=ask)
