"""
From the database to the planner's plain data: capacity snapshots and requests.

Platform-wide on purpose (the scheduler sees the whole fleet). Spares, nodes that may not take
work and GPUs that are not healthy never enter a snapshot, so the planner cannot pick them.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime, timedelta
from uuid import UUID

from django.conf import settings
from django.db import connection
from django.db.models import Count, Exists, Max, OuterRef, Q

from cloud.choices import GPUState, OfferingKind, pool_of
from cloud.models import GPU, Node, Region, Switch
from core.db import fast_cursor
from provisioning.allocations import ALLOCATABLE_NODE_STATES
from provisioning.capacity import SELLABLE_HEALTH
from provisioning.choices import BillingTerm, OperationKind, OperationState
from provisioning.models import Allocation, Operation, Reservation
from provisioning.scheduling.plan_types import (
    CONFIDENTIAL_POOL_SUFFIX,
    Busy,
    GPUCapacity,
    NodeCapacity,
    Request,
    Snapshot,
    capacity_pool,
)

UNUSABLE_GPU_STATES = [GPUState.QUARANTINED]
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def load_snapshot(*, now: datetime, until: datetime, regions=None, gpu_model_ids=None, pool=None,
                  free_only: bool = False, node_ids=None, confidential: bool | None = None) -> Snapshot:
    """
    Capacity of the sellable fleet (optionally narrowed), with every allocation overlapping
    [now, until). ``free_only``: only GPUs with nothing in that window (what a whole-GPU request
    can use without evicting anyone); ``node_ids``: only these nodes (see ``free_candidates``).
    """
    nodes, gpus = _sellable(now=now, until=until, regions=regions, gpu_model_ids=gpu_model_ids, pool=pool,
                            free_only=free_only, confidential=confidential)
    if node_ids is not None:
        nodes, gpus = nodes.filter(pk__in=list(node_ids)), gpus.filter(node_id__in=list(node_ids))
    busy = {} if free_only else window_allocations(now, until, gpus)

    by_node = defaultdict(list)
    models = {}
    for gpu_id, node_id, index, memory, model_id, domain, switch, numa in gpus.values_list(
            "id", "node_id", "index", "memory_mib", "model_id", "nvlink_domain", "pcie_switch", "numa_node"):
        by_node[node_id].append(GPUCapacity(gpu_id=gpu_id, index=index, memory_mib=memory, busy=busy.get(gpu_id, []),
                                            nvlink_domain=domain, pcie_switch=switch, numa_node=numa))
        models[node_id] = model_id
    capacity = [
        NodeCapacity(node_id=node_id, region=region, fabric_id=fabric_id, leaf_id=leaf_id, pod=pod,
                     pool=capacity_pool(node_pool, confidential_node), gpu_model_id=models[node_id],
                     gpus=sorted(by_node[node_id], key=lambda g: g.index), installed=installed)
        for node_id, region, fabric_id, leaf_id, pod, node_pool, confidential_node, installed in nodes.filter(
            pk__in=list(by_node)).values_list("id", "region__slug", "fabric_id", "leaf_id", "leaf__pod", "pool",
                                              "confidential", "gpus_installed")
    ]
    return Snapshot(now=now, nodes=capacity)


# A GPU that may take work (its node aside).
SELLABLE_GPU = Q(health__in=SELLABLE_HEALTH) & ~Q(state__in=UNUSABLE_GPU_STATES)


def sellable_nodes():
    """The nodes that may take work: no spare, in an allocatable state, healthy, not being attested."""
    # A node whose idle attestation is under way is not sold until it has passed.
    attesting = Operation.objects.filter(node=OuterRef("pk"), kind=OperationKind.ATTEST,
                                         state__in=[OperationState.PENDING, OperationState.RUNNING])
    return Node.objects.filter(is_spare=False, state__in=ALLOCATABLE_NODE_STATES, health__in=SELLABLE_HEALTH).exclude(
        Exists(attesting))


def _sellable(*, now, until, regions, gpu_model_ids, pool, free_only, confidential=None):
    """The nodes that may take work and their usable GPUs (only those free in the window, if asked)."""
    nodes = sellable_nodes()
    if regions is not None:
        nodes = nodes.filter(region__slug__in=list(regions))
    if pool is not None:
        nodes = nodes.filter(pool=pool)
    if confidential is not None:
        nodes = nodes.filter(confidential=confidential)
    gpus = GPU.objects.filter(SELLABLE_GPU, node__in=nodes)
    if gpu_model_ids is not None:
        gpus = gpus.filter(model_id__in=list(gpu_model_ids))
    if free_only:
        in_window = Allocation.objects.filter(ends_at__gt=now, starts_at__lt=until, gpu=OuterRef("pk"))
        gpus = gpus.exclude(Exists(in_window))
    return nodes, gpus


def free_candidates(request: Request, *, now: datetime, spare: int = 4) -> list | None:
    """
    The few nodes an on-demand whole-GPU request would be placed on, from one aggregate query of
    free GPUs per node (no row per GPU): the best-fitting hosts for VMs and containers, or for
    bare metal the whole-free nodes of the leaves the planner prefers (those with the fewest
    whole-free nodes that hold the gang, ``choose_nodes``). None when that does not settle it
    (the caller reads the pool).
    """
    _, gpus = _sellable(now=now, until=request.end, regions=request.regions, gpu_model_ids=request.gpu_model_ids,
                        pool=pool_of(request.kind), free_only=True, confidential=request.confidential)
    if request.fabric_id is not None:
        gpus = gpus.filter(node__fabric_id=request.fabric_id)
    per_node = gpus.values_list("node_id", "node__leaf_id").annotate(free=Count("pk"), installed=Max(
        "node__gpus_installed"))
    return choose_nodes(per_node, request, spare=spare)


def choose_nodes(per_node, request: Request, *, spare: int, leaves: int = 2) -> list | None:
    """
    ``free_candidates``'s choice from ``(node_id, leaf_id, free GPUs)`` rows: the ``units +
    spare`` best-fitting hosts (fewest free GPUs that still hold a unit), or for bare metal the
    whole-free nodes of the leaves that hold the gang, fewest whole-free nodes first: at least
    ``leaves`` of them, and more until ``units + spare`` nodes are chosen (with ``leaves=1``,
    only ``units + spare`` of the first leaf's). None when they do not hold the request.
    """
    g = request.gpus_per_unit
    if request.kind != OfferingKind.BARE_METAL:
        fitting = sorted((free, str(node), node) for node, _, free, *_ in per_node if free >= g)[:request.units + spare]
        return [node for *_, node in fitting] if sum(free // g for free, *_ in fitting) >= request.units else None
    by_leaf = defaultdict(list)
    for node, leaf, free, *installed in per_node:
        # Whole: every GPU of a node of the request's shape is free (a hint's rows do not know the shape:
        # the read of the chosen nodes checks it).
        if free == g and (not installed or installed[0] == g):
            by_leaf[leaf].append(node)
    holding = sorted((len(free), str(leaf), free) for leaf, free in by_leaf.items() if len(free) >= request.units)
    if leaves == 1:
        return sorted(holding[0][2], key=str)[:request.units + spare] if holding else None
    chosen = []
    for rank, (_, _, free) in enumerate(holding):
        if rank >= leaves and len(chosen) >= request.units + spare:
            break
        chosen += sorted(free, key=str)
    return chosen or None


def free_snapshot(request: Request, *, now: datetime, spare: int = 4, nodes: list | None = None) -> Snapshot | None:
    """
    ``load_snapshot(free_only=True, node_ids=free_candidates(...))`` for an on-demand whole-GPU
    request: the candidate nodes with their free GPUs, or None when the candidates do not settle
    it. ``nodes``: read these (a recent read's choice, ``free_hint``) instead of choosing from
    the pool. On PostgreSQL it is one statement, where the ORM's three queries cost a third of a
    create (most of it building and planning them).
    """
    if connection.vendor != "postgresql":
        candidates = free_candidates(request, now=now, spare=spare) if nodes is None else nodes
        if not candidates:
            return None
        snapshot = load_snapshot(now=now, until=request.end, regions=request.regions,
                                 gpu_model_ids=request.gpu_model_ids, pool=pool_of(request.kind), free_only=True,
                                 node_ids=candidates, confidential=request.confidential)
        return snapshot if _settles(_whole_only(snapshot, request), request) else None
    g = request.gpus_per_unit
    params = {
        "health": list(SELLABLE_HEALTH), "unusable": list(UNUSABLE_GPU_STATES),
        "models": list(request.gpu_model_ids), "node_states": sorted(ALLOCATABLE_NODE_STATES),
        "regions": list(request.regions), "pool": pool_of(request.kind), "confidential": request.confidential,
        "fabric": request.fabric_id, "attest": OperationKind.ATTEST, "cc_suffix": CONFIDENTIAL_POOL_SUFFIX,
        "attesting": [OperationState.PENDING, OperationState.RUNNING], "now": now, "until": request.end, "g": g,
        "units": request.units, "take": request.units + spare, "nodes": list(nodes or ()),
    }
    placed = places_read(request)
    if nodes is not None:
        sql = _FREE_ON_NODES_PLACED_SQL if placed else _FREE_ON_NODES_SQL
    elif request.kind == OfferingKind.BARE_METAL:
        sql = _FREE_BARE_METAL_SQL
    else:
        sql = _FREE_BEST_FIT_PLACED_SQL if placed else _FREE_BEST_FIT_SQL
    # Reading the pool, a client-side cursor: never prepared. PostgreSQL's generic plan for those
    # statements (the one it keeps after a prepared statement's fifth run) scans and joins the
    # whole pool the slow way: six times slower than the plan made for the values at hand. A few
    # nodes' read is prepared (fast_cursor): its generic plan is the index lookups it should be.

    with (fast_cursor() if nodes is not None else connection.cursor()) as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    snapshot = Snapshot(now=now, nodes=[
        NodeCapacity(node_id=node_id, region=region, fabric_id=fabric_id, leaf_id=leaf_id, pod=pod, pool=pool,
                     gpu_model_id=model_id, installed=installed,
                     gpus=[GPUCapacity(gpu_id=gpu_id, index=index, memory_mib=memory, nvlink_domain=domain,
                                       pcie_switch=switch, numa_node=numa)
                           for gpu_id, index, memory, domain, switch, numa in zip(
                               ids, indexes, memories, *(places or [[None] * len(ids)] * 3), strict=True)])
        for (node_id, region, fabric_id, leaf_id, pod, pool, model_id, ids, indexes, memories, installed,
             *places) in rows
    ])
    return snapshot if _settles(_whole_only(snapshot, request), request) else None


def places_read(request: Request) -> bool:
    """
    Whether ``free_snapshot`` reads where the GPUs sit in their node: only for units of several
    GPUs (a 1-GPU unit or a whole node has no link to choose), so the common creates read no more.
    """
    return request.kind != OfferingKind.BARE_METAL and request.gpus_per_unit > 1


def _whole_only(snapshot: Snapshot, request: Request) -> Snapshot:
    """Bare metal from free GPUs only: the nodes all of whose installed GPUs are free (a node sells whole)."""
    if request.kind == OfferingKind.BARE_METAL:
        snapshot.nodes = [node for node in snapshot.nodes if not node.installed or len(node.gpus) == node.installed]
    return snapshot


def _settles(snapshot: Snapshot, request: Request) -> bool:
    """Whether free capacity read for an on-demand request can hold it, as far as counting tells."""
    g = request.gpus_per_unit
    if request.kind == OfferingKind.BARE_METAL:
        return sum(len(node.gpus) == g for node in snapshot.nodes) >= request.units
    return sum(len(node.gpus) // g for node in snapshot.nodes) >= request.units


def _free_sql(chosen: str, on_nodes: bool = False, places: bool = False) -> str:
    """
    The free-GPU statement of ``free_snapshot``: ``sellable_nodes`` and ``SELLABLE_GPU`` with no
    allocation in the window (``_sellable``, free_only), per node; ``chosen`` picks the nodes as
    ``free_candidates`` does; ``on_nodes``: only the nodes given; ``places``: with where each GPU
    sits in its node (NVLink domain, PCIe switch, NUMA node). Only table names and fixed clauses
    are formatted in; every value is a parameter.
    """
    gpu, node, region, switch = (m._meta.db_table for m in (GPU, Node, Region, Switch))
    operation, allocation = Operation._meta.db_table, Allocation._meta.db_table
    # The window's busy GPUs are read once and hashed: probing the allocations' index once per
    # GPU cost half the statement on a pool of 7,000 GPUs. Only the given nodes' when given.
    on_given = "AND a.node_id = ANY(%(nodes)s::uuid[])" if on_nodes else ""
    return f"""
        WITH busy AS MATERIALIZED (
            SELECT a.gpu_id FROM {allocation} a
            WHERE a.ends_at > %(now)s AND a.starts_at < %(until)s AND NOT a.archived {on_given}
        ),
        free AS (
            SELECT g.id, g.node_id, g.index, g.memory_mib, g.model_id, n.leaf_id, n.gpus_installed AS installed
                   {", g.nvlink_domain, g.pcie_switch, g.numa_node" if places else ""}
            FROM {gpu} g JOIN {node} n ON n.id = g.node_id JOIN {region} r ON r.id = n.region_id
            WHERE g.health = ANY(%(health)s) AND NOT (g.state = ANY(%(unusable)s))
              AND g.model_id = ANY(%(models)s) AND NOT n.is_spare AND n.state = ANY(%(node_states)s)
              AND n.health = ANY(%(health)s) AND r.slug = ANY(%(regions)s) AND n.pool = %(pool)s
              AND n.confidential = %(confidential)s
              {"AND n.id = ANY(%(nodes)s::uuid[])" if on_nodes else ""}
              AND (%(fabric)s::uuid IS NULL OR n.fabric_id = %(fabric)s::uuid)
              AND NOT EXISTS (SELECT 1 FROM {operation} o WHERE o.node_id = n.id AND o.kind = %(attest)s
                              AND o.state = ANY(%(attesting)s))
              AND NOT EXISTS (SELECT 1 FROM busy b WHERE b.gpu_id = g.id)
        ),
        per_node AS (SELECT node_id, leaf_id, count(*) AS free, max(installed) AS installed FROM free
                     GROUP BY node_id, leaf_id),
        chosen AS ({chosen})
        SELECT n.id, r.slug, n.fabric_id, n.leaf_id, s.pod,
               n.pool || CASE WHEN n.confidential THEN %(cc_suffix)s ELSE '' END,
               (array_agg(f.model_id ORDER BY f.index DESC))[1],
               array_agg(f.id ORDER BY f.index), array_agg(f.index ORDER BY f.index),
               array_agg(f.memory_mib ORDER BY f.index), max(f.installed)
               {_PLACES_AGGREGATED if places else ""}
        FROM chosen c JOIN free f ON f.node_id = c.node_id JOIN {node} n ON n.id = c.node_id
        JOIN {region} r ON r.id = n.region_id JOIN {switch} s ON s.id = n.leaf_id
        GROUP BY n.id, r.slug, s.pod ORDER BY n.hostname
    """  # noqa: S608


def headroom_from(reservation: Reservation, now: datetime) -> datetime | None:
    """
    When reserved work may use the headroom kept for on-demand bursts: once it has waited
    MERIDIAN_HEADROOM_MAX_WAIT from its submission (or its requested start, if later), so a
    headroom that on-demand work keeps full holds it back for that long, not for ever. None for
    other terms (spot work is the planner's: MERIDIAN_SPOT_IN_HEADROOM) or when the wait is 0.
    """
    limit = settings.MERIDIAN_HEADROOM_MAX_WAIT
    if reservation.billing_term != BillingTerm.RESERVED or limit <= timedelta(0):
        return None
    since = reservation.submitted_at or now  # not saved yet: it is being submitted
    if reservation.requested_start and reservation.requested_start > since:
        since = reservation.requested_start
    return since + limit


def request_for(reservation: Reservation, now: datetime) -> Request:
    """The planner's view of a reservation: where, what, how many, when, and how it may be evicted."""
    offering = reservation.offering
    start = max(reservation.requested_start or now, now)
    return Request(
        reservation_id=reservation.pk,
        kind=offering.kind,
        gpu_model_ids=(reservation.gpu_model_id,),
        regions=tuple(reservation.regions),
        units=reservation.units,
        gpus_per_unit=offering.gpus_per_unit,
        slots_per_gpu=offering.slots_per_gpu,
        start=start,
        end=start + reservation.duration,
        priority=reservation.score,
        preemptible=reservation.billing_term == BillingTerm.SPOT,
        on_demand=reservation.billing_term == BillingTerm.ON_DEMAND,
        headroom_from=headroom_from(reservation, now),
        may_preempt=reservation.billing_term != BillingTerm.SPOT,
        eviction_grace=settings.MERIDIAN_SPOT_GRACE,
        fabric_id=reservation.vpc.fabric_id if reservation.vpc_id else None,
        share_class=offering.time_slice_class,
        confidential=offering.confidential,
    )


def window_allocations(now: datetime, until: datetime, gpus=None, node_ids=None) -> dict[UUID, list[Busy]]:
    """
    Every allocation overlapping [now, until) (on ``gpus``, a GPU queryset, or on the nodes
    ``node_ids``, when given), per GPU, by start.
    """
    busy = defaultdict(list)
    if connection.vendor == "postgresql":
        rows = _window_rows_postgresql(now, until, gpus, node_ids)
    else:
        in_window = Allocation.objects.filter(ends_at__gt=now, starts_at__lt=until, archived=False)
        if gpus is not None:
            in_window = in_window.filter(gpu__in=gpus)
        if node_ids is not None:
            in_window = in_window.filter(node_id__in=list(node_ids))
        rows = in_window.order_by("starts_at").values_list(
            "gpu_id", "reservation_id", "starts_at", "ends_at", "mem_lo", "mem_hi", "reservation__billing_term",
            "reservation__score", "share_class")
        rows = ((g, r, s, e, lo, hi, term == BillingTerm.SPOT, score, klass)
                for g, r, s, e, lo, hi, term, score, klass in rows)
    for gpu_id, reservation_id, start, end, lo, hi, spot, score, klass in rows:
        busy[gpu_id].append(Busy(reservation_id, start, end, lo, hi, spot, score, klass))
    return busy


def _window_rows_postgresql(now: datetime, until: datetime, gpus, node_ids=None):
    """
    The same rows with times as microseconds since the epoch: parsing 20,000 timestamps as text
    cost more than the query; integers cost a tenth of that.
    """
    a, r = Allocation._meta.db_table, Reservation._meta.db_table
    on_gpus, params = "", []
    if gpus is not None:
        subquery, params = gpus.values("pk").query.sql_with_params()
        on_gpus = f"AND a.gpu_id IN ({subquery}) "
    if node_ids is not None:
        on_gpus, params = on_gpus + "AND a.node_id = ANY(%s) ", [*params, list(node_ids)]
    # Only the models' table names and the ORM's own SQL are formatted in; every value is a parameter.
    sql = (f"SELECT a.gpu_id, a.reservation_id, (EXTRACT(EPOCH FROM a.starts_at) * 1000000)::bigint, "  # noqa: S608
           f"(EXTRACT(EPOCH FROM a.ends_at) * 1000000)::bigint, a.mem_lo, a.mem_hi, r.billing_term = %s, r.score, "
           f"a.share_class "
           f"FROM {a} a JOIN {r} r ON r.id = a.reservation_id WHERE a.ends_at > %s AND a.starts_at < %s "
           f"AND NOT a.archived {on_gpus}"
           f"ORDER BY a.starts_at")
    with connection.cursor() as cursor:
        cursor.execute(sql, [BillingTerm.SPOT, now, until, *params])
        rows = cursor.fetchall()
    micro = timedelta(microseconds=1)
    return ((g, rid, EPOCH + s * micro, EPOCH + e * micro, lo, hi, spot, score, klass)
            for g, rid, s, e, lo, hi, spot, score, klass in rows)


_PLACES_AGGREGATED = (", array_agg(f.nvlink_domain ORDER BY f.index), array_agg(f.pcie_switch ORDER BY f.index), "
                      "array_agg(f.numa_node ORDER BY f.index)")
# VMs and containers: the best-fitting hosts (fewest free GPUs that still hold a unit) and a few more.
_BEST_FIT = "SELECT node_id FROM per_node WHERE free >= %(g)s ORDER BY free, node_id LIMIT %(take)s"
_FREE_BEST_FIT_SQL = _free_sql(_BEST_FIT)
_FREE_BEST_FIT_PLACED_SQL = _free_sql(_BEST_FIT, places=True)
# Bare metal: the whole-free nodes of the leaves that hold the gang, fewest whole-free nodes first:
# two leaves at least, and more until ``take`` nodes are chosen (choose_nodes, leaves=2). The
# fast path's hint keeps them all: taken leaf by leaf, a read of two small leaves lasted a few creates.
# The leaves as an array (computed once): as an IN subquery PostgreSQL planned the window eight
# times slower.
_FREE_BARE_METAL_SQL = _free_sql(
    "SELECT node_id FROM per_node WHERE free = %(g)s AND installed = %(g)s AND leaf_id = ANY(ARRAY("
    "SELECT leaf_id FROM (SELECT leaf_id, count(*) AS whole, row_number() OVER w AS rank, "
    "sum(count(*)) OVER w AS running FROM per_node WHERE free = %(g)s AND installed = %(g)s GROUP BY leaf_id "
    "HAVING count(*) >= %(units)s WINDOW w AS (ORDER BY count(*), leaf_id::text)) AS leaves "
    "WHERE rank <= 2 OR running - whole < %(take)s))")
# The nodes a recent read chose (free_hint): those with a free GPU, counted again now.
_FREE_ON_NODES_SQL = _free_sql("SELECT node_id FROM per_node", on_nodes=True)
_FREE_ON_NODES_PLACED_SQL = _free_sql("SELECT node_id FROM per_node", on_nodes=True, places=True)
