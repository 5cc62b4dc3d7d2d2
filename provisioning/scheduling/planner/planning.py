"""
The Planner: one request at a time against an indexed Snapshot, each decision recorded so the
next one sees it; and ``plan``, which runs a ranked queue through it.

Order of trial, for one request: its regions in its order (burst into the next when one cannot
hold it), within a region its GPU models in its order, within those every fabric (the best
topology wins). Only when no region can hold it without evicting anything, and the request may
preempt, the same order is tried again with lower-priority spot work as possible victims.

The headroom (a share of each region's GPUs of a model and pool kind) is kept for on-demand
bursts: reserved work may not take it until it has waited for it (``Request.headroom_from``).
Spot work may -- it is the capacity spot sells -- and gives it back as any spot work does, by
soft eviction to on-demand work that ranks above it (nearly always: spot is sold at low
urgency); GPUs only spot work holds still count as headroom, so reserved work is kept out only
by what on-demand work would otherwise have to wait for. That is
``spot_in_headroom``, which callers take from MERIDIAN_SPOT_IN_HEADROOM. Evicting spot work of
any rank to give the headroom back was measured and dropped: it evicted the spot work that had
waited longest, just started, and tripled spot waits on the trace mix (docs/benchmarks.md). A GPU
cut into slots counts whole, or by its free share with ``slot_shares`` (planner.load), which the
trace bench measured and production does not use.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from uuid import UUID

from provisioning.scheduling.plan_types import (
    BARE_METAL,
    BARE_METAL_POOL,
    CONFIDENTIAL_POOL_SUFFIX,
    CONTAINER,
    SHARED_POOL,
    VM,
    Assignment,
    Eviction,
    Placement,
    Plan,
    Request,
    Snapshot,
)
from provisioning.scheduling.planner.fit import Fit, Shortfall, gang, slot_units, vm_units
from provisioning.scheduling.planner.preempt import gang_evicting, slots_evicting, vm_evicting
from provisioning.scheduling.planner.reasons import NO_CAPACITY, Wording
from provisioning.scheduling.planner.state import FOREVER, TICK, Capacity, Entry, Pool

# A shape that failed is remembered this many times per (shape, start) before the oldest is dropped.
FAILURES_PER_SHAPE = 8


class Failures:
    """
    Requests that found no room, by shape. Within a plan capacity only shrinks until an eviction
    or a release (which clear this), so a request of the same shape, from the same start, asking
    for as many units or more until as late or later cannot fit either: the reason of the first
    is reused instead of searching again. Its counts are those that first request saw.
    """

    def __init__(self) -> None:
        self._seen: dict[tuple, list[tuple[int, int, list[str]]]] = {}

    def find(self, shape: tuple, end: int, units: int) -> list[str] | None:
        for seen_end, seen_units, situations in self._seen.get(shape, ()):
            if seen_end <= end and seen_units <= units:
                return situations
        return None

    def add(self, shape: tuple, end: int, units: int, situations: list[str]) -> None:
        seen = self._seen.setdefault(shape, [])
        seen.append((end, units, situations))
        if len(seen) > FAILURES_PER_SHAPE:
            del seen[0]

    def clear(self) -> None:
        self._seen.clear()


def uses_headroom(request: Request, at: datetime, *, spot_in_headroom: bool) -> bool:
    """
    Whether ``request`` may take the headroom for a window from ``at``: on-demand work; spot work
    when ``spot_in_headroom``; reserved work from its ``headroom_from`` (it has waited for it).
    """
    if request.on_demand:
        return True
    if request.preemptible:
        return spot_in_headroom
    return request.headroom_from is not None and at >= request.headroom_from


def invalid(request: Request) -> str | None:
    """What makes a request impossible to place whatever the capacity; admission should have refused it."""
    if request.kind not in (BARE_METAL, VM, CONTAINER):
        return f"unknown kind {request.kind!r}"
    if not request.regions or not request.gpu_model_ids:
        return "it names no region or no GPU model"
    if request.units < 1 or request.gpus_per_unit < 1 or request.slots_per_gpu < 1:
        return "it asks for no capacity"
    if request.kind == BARE_METAL and request.slots_per_gpu > 1:
        return "bare metal is sold in whole nodes, not GPU slots"
    if request.end <= request.start:
        return "its window ends before it starts"
    return None


class Planner:
    """
    Decides placements one request at a time on one Snapshot, remembering each (so later requests
    see it). Pure: no database, no clock, no I/O; the same snapshot and requests give the same plan.
    """

    def __init__(self, snapshot: Snapshot | None = None, *, headroom: float = 0.10,
                 model_names: Mapping[UUID, str] | None = None, capacity: Capacity | None = None,
                 spot_in_headroom: bool = True, slot_shares: bool = False):
        # ``capacity``: an index kept from an earlier plan and brought up to date, instead of a snapshot.
        # Both default to what Meridian runs (MERIDIAN_SPOT_IN_HEADROOM on), so a caller that forgets
        # them gets the production rule. ``spot_in_headroom`` False: spot work is kept out of the
        # headroom like reserved work, and what it holds is not headroom; ``slot_shares`` False: a
        # cut GPU counts whole in it.
        self.capacity = capacity if capacity is not None else Capacity(snapshot, slot_shares=slot_shares)
        self.capacity.count_spot_as_free(spot_in_headroom)
        self.headroom = headroom
        self.spot_in_headroom = spot_in_headroom
        self.wording = Wording(self.capacity.now, model_names or {}, origin=self.capacity.origin)
        self.last_reason = ""
        self._reasons: dict[UUID, str] = {}
        self._placed: set[UUID] = set()
        self._failures = Failures()

    def place(self, request: Request) -> Placement | None:
        """
        Place ``request`` and record it, evicting spot work if it must and may; or ``None``, with
        the reason in ``last_reason`` and ``why_not``. Never double-books GPU memory in time.
        """
        try:
            placement, reason = self._attempt(request)
        except BaseException:
            self.capacity.rollback()
            raise
        self.capacity.commit()
        if placement is None:
            self._reasons[request.reservation_id] = self.last_reason = reason
        else:
            self._reasons.pop(request.reservation_id, None)
            self._placed.add(request.reservation_id)
            self.last_reason = ""
        return placement

    def why_not(self, request: Request) -> str:
        """Why ``request`` waits: the reason of its last failed ``place``, or else of a trial that changes nothing."""
        if request.reservation_id in self._reasons:
            return self._reasons[request.reservation_id]
        try:
            placement, reason = self._attempt(request)
        finally:
            self.capacity.rollback()
        return reason if placement is None else "it fits now"

    def release(self, placement: Placement) -> None:
        """Forget a placement (it ended or was cancelled): its GPU memory is free again. Evictions stay done."""
        for gpu_id in {a.gpu_id for a in placement.assignments}:
            self.capacity.remove_owner(self.capacity.gpus[gpu_id], placement.reservation_id)
        self.capacity.commit()
        self._placed.discard(placement.reservation_id)
        self._failures.clear()

    #
    # One request
    #

    def _attempt(self, request: Request) -> tuple[Placement | None, str]:
        """Find and record a placement, leaving the undo steps in the journal; or say why there is none."""
        problem = invalid(request)
        if problem:
            return None, problem
        if request.reservation_id in self._placed:
            return None, "it is placed already"
        if request.end <= self.capacity.time(self.capacity.origin):
            return None, "its window has already ended"
        s, e = self._window(request)
        shape = self._shape(request, s)
        known = self._failures.find(shape, e, request.units)
        if known is not None:
            return None, self.wording.reason(request, s, e, known)
        situations = []
        for region in request.regions:
            for model in request.gpu_model_ids:
                outcome = self._place_in(request, region, model, s, e)
                if isinstance(outcome, Placement):
                    return outcome, ""
                situations.append(outcome)
        if self._may_evict(request):
            outcome = self._place_evicting(request, s, e)
            if isinstance(outcome, Placement):
                return outcome, ""
            situations.append(outcome)
        self._failures.add(shape, e, request.units, situations)
        return None, self.wording.reason(request, s, e, situations)

    def _window(self, request: Request) -> tuple[int, int]:
        """The window in ticks; one that began before now starts now, keeping its length."""
        s, e = self.capacity.ticks(request.start), self.capacity.ticks(request.end)
        now = self.capacity.origin
        return (s, e) if s >= now else (now, e - s + now)

    def _shape(self, request: Request, s: int) -> tuple:
        """Everything but the units and the end that decides whether a request fits (see Failures)."""
        evicting = None
        if self._may_evict(request):
            evicting = (self.capacity.victims_below(request.priority), request.eviction_grace)
        # When reserved work may use the headroom, as such (its reason names it), unless that is past:
        # the guard is decided again at the start an eviction moves the window to.
        waited = request.headroom_from
        if waited is not None and self.capacity.ticks(waited) <= self.capacity.origin:
            waited = "waited"
        return (request.kind, request.gpu_model_ids, request.regions, request.fabric_id, request.gpus_per_unit,
                request.slots_per_gpu, request.share_class, request.on_demand, request.preemptible, waited,
                request.confidential, s, evicting)

    @staticmethod
    def _may_evict(request: Request) -> bool:
        """Spot work never preempts, so two spot requests cannot evict each other in turn."""
        return request.may_preempt and not request.preemptible

    def _guarded(self, request: Request, s: int) -> bool:
        """Whether the headroom is kept from ``request`` for a window from ``s`` (``uses_headroom``)."""
        return self.headroom > 0 and not uses_headroom(request, self.capacity.time(s),
                                                       spot_in_headroom=self.spot_in_headroom)

    def _kept(self, group: tuple) -> float:
        """The headroom of a ``(region, model, pool kind)``, in GPUs (to the millionth: 0.1 x 30 is 3)."""
        return round(self.headroom * self.capacity.group_gpus.get(group, 0), 6)

    def _pools(self, request: Request, region: str, model: UUID) -> list[Pool]:
        """The region's pools of the model and kind, on the request's fabric only when it names one (its VPC's)."""
        pools = self.capacity.pools.get((region, model, self._pool_kind(request))) or []
        return [p for p in pools if p.fabric == request.fabric_id] if request.fabric_id else pools

    @staticmethod
    def _pool_kind(request: Request) -> str:
        kind = BARE_METAL_POOL if request.kind == BARE_METAL else SHARED_POOL
        return kind + CONFIDENTIAL_POOL_SUFFIX if request.confidential else kind

    def _place_in(self, request: Request, region: str, model: UUID, s: int, e: int) -> Placement | str:
        """The best fit over the fabrics of one region and model, recorded; or what they lack."""
        where = self.wording.where(region, model)
        pools = self._pools(request, region, model)
        if not pools:
            return f"{where}: no {self._pool_kind(request).replace('_', '-').replace('+cc', ' confidential')} nodes"
        fits: list[Fit] = []
        short = Shortfall()
        for pool in pools:
            found = self._fit(pool, request, s, e, self.capacity.origin)
            if isinstance(found, Fit):
                fits.append(found)
            else:
                short += found
        if not fits:
            return self.wording.shortfall(request, where, short, self._next_release(pools, s))
        return self._commit(request, region, where, min(fits, key=lambda f: f.score), s, e)

    @staticmethod
    def _fit(pool: Pool, request: Request, s: int, e: int, now: int | None = None) -> Fit | Shortfall:
        if request.kind == BARE_METAL:
            return gang(pool, request.units, request.gpus_per_unit, s, e)
        if request.slots_per_gpu > 1:
            return slot_units(pool, request.units, request.slots_per_gpu, s, e, request.share_class, now)
        return vm_units(pool, request.units, request.gpus_per_unit, s, e)

    @staticmethod
    def _next_release(pools: list[Pool], s: int) -> int:
        """When the first GPU busy at the window's start frees up: the free counts hold until then."""
        return min((n.busy_min for p in pools for n in p.nodes if s < n.busy_min < FOREVER), default=FOREVER)

    #
    # Preemption
    #

    def _place_evicting(self, request: Request, s: int, e: int) -> Placement | str:
        """
        Place by evicting lower-priority spot work, in the same region and model order. Soft
        eviction (a grace period) ends the victims at now + grace, and the window starts no
        earlier, keeping its length; hard eviction ends them now. For a window that starts later
        than that, the victims run on until it starts: ending them sooner frees nothing it needs.
        """
        grace = self.capacity.origin + max(0, request.eviction_grace // TICK)
        if s < grace:
            s, e = grace, grace + (e - s)
        at = s
        refused = []
        for region in request.regions:
            for model in request.gpu_model_ids:
                pools = self._pools(request, region, model)
                fits = [f for pool in pools
                        if (f := self._fit_evicting(pool, request, s, e, request.priority)) and f.victims]
                if fits:
                    where = self.wording.where(region, model)
                    outcome = self._commit(request, region, where, min(fits, key=lambda f: f.score), s, e, at)
                    if isinstance(outcome, Placement):
                        return outcome
                    refused.append(f"evicting: {outcome}")
        return "; ".join(refused) or NO_CAPACITY

    def _fit_evicting(self, pool: Pool, request: Request, s: int, e: int, bar: float) -> Fit | None:
        priority_of = self.capacity.victim_priority
        held = sum(count for v, count in pool.victims.items() if priority_of[v] < bar)
        if not held:
            return None
        if request.kind == BARE_METAL:
            free = sum(n.size for n in pool.nodes if n.whole_free(s, e))
            if free + held < request.units * request.gpus_per_unit:
                return None  # even every eligible victim's GPUs would not be enough
            return gang_evicting(pool, request.units, request.gpus_per_unit, s, e, bar, priority_of)
        if request.slots_per_gpu > 1:
            return slots_evicting(pool, request.units, request.slots_per_gpu, s, e, bar, priority_of,
                                  request.share_class)
        if sum(n.free_count(s, e) for n in pool.nodes) + held < request.units * request.gpus_per_unit:
            return None
        return vm_evicting(pool, request.units, request.gpus_per_unit, s, e, bar, priority_of,
                           self.capacity.holdings)

    #
    # Recording a decision
    #

    def _commit(self, request: Request, region: str, where: str, fit: Fit, s: int, e: int,
                at: int | None = None) -> Placement | str:
        """
        Evict ``fit``'s victims (ending at ``at``), book its GPU memory for ``[s, e)``, and build
        the Placement. A guarded request (``_guarded``) that would leave the region fewer free GPUs
        at its start than the headroom is undone.
        """
        cap = self.capacity
        at = cap.origin if at is None else at  # evictions end now unless a grace period says later
        rid = request.reservation_id
        guard = self._guarded(request, s)
        # The headroom is a share of the region's GPUs of this model in this pool, as the fast path sees them.
        group = (region, fit.pool.model, fit.pool.kind)
        kept = self._kept(group)
        before = cap.free_at(group, s) if guard else 0  # with spot work in the headroom, what only it holds is free
        mark = len(cap.journal)
        victims = sorted(fit.victims, key=lambda v: (cap.victim_priority[v], str(v)))
        when = "after a grace period" if at > cap.origin else "at once"
        evictions = tuple(
            Eviction(v, rid, cap.time(at), f"preempted by reservation {rid} (priority {request.priority:.3f} over "
                                           f"{cap.victim_priority[v]:.3f}), {when}")
            for v in victims
        )
        for v in victims:
            cap.evict(v, at)
        for gpu, lo, hi in fit.picks:
            cap.add(gpu, Entry(s, e, lo, hi, rid, share_class=request.share_class))
        if guard:
            after = cap.free_at(group, s)
            if after < kept and after < before:
                cap.rollback(mark)
                return self.wording.headroom(where, s, before, after, kept, spot=self.spot_in_headroom,
                                             until=request.headroom_from)
        if victims:
            self._failures.clear()  # evictions free capacity: earlier failures may fit now
        return Placement(
            reservation_id=rid,
            region=region,
            start=cap.time(s),
            end=cap.time(e),
            assignments=tuple(Assignment(g.node.node_id, g.gpu_id, lo, hi, request.share_class)
                              for g, lo, hi in fit.picks),
            leaves=len({g.node.leaf.leaf_id for g, _, _ in fit.picks}),
            evictions=evictions,
        )


def plan(snapshot: Snapshot | None, queue: Iterable[Request], *, headroom: float = 0.10,
         model_names: Mapping[UUID, str] | None = None, max_placements: int | None = None,
         capacity: Capacity | None = None, spot_in_headroom: bool = True) -> Plan:
    """
    Place the ranked ``queue`` in its order on ``snapshot``: each request sees the ones before it.
    Every request tried and not placed is in ``unplaced`` with why it waits. Planning stops after
    ``max_placements``: the requests after that point are not tried (they wait for the next plan).
    A kept ``capacity`` (instead of a snapshot) is planned on and left as the plan leaves it:
    its keeper knows what changed (``Capacity.touched``).
    """
    planner = Planner(snapshot, headroom=headroom, model_names=model_names, capacity=capacity,
                      spot_in_headroom=spot_in_headroom)
    result = Plan()
    for request in queue:
        if max_placements is not None and len(result.placements) >= max_placements:
            result.cut_short = True
            break
        placement = planner.place(request)
        if placement is None:
            result.unplaced[request.reservation_id] = planner.last_reason
        else:
            result.placements.append(placement)
    if capacity is None:
        planner.capacity.dispose()
    return result
