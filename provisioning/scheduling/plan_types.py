"""
The plain data the scheduler's pure planner works on: a snapshot of capacity in, a plan out.

No Django here. ``provisioning.scheduling.scheduler`` loads a Snapshot from the database, the planner
(``provisioning.scheduling.planner``) decides, and services apply the Plan under the database's guarantee
(no two allocations of the same GPU memory overlap in time).

Capacity is per GPU and per stretch of its memory: a whole-GPU allocation covers the GPU's whole
memory ``[0, memory_mib)``; slot ``k`` of a fractional offering cut into ``n`` slots covers
``[k * memory_mib // n, (k + 1) * memory_mib // n)``; a time-sliced slot is such a slot that also
carries its slice class, and slots of two classes never share a GPU. Two allocations conflict when they are on
the same GPU, their memory ranges overlap, and their time ranges ``[start, end)`` overlap.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import NamedTuple
from uuid import UUID

BARE_METAL = "bare_metal"
VM = "vm"
CONTAINER = "container"
SHARED_POOL = "shared"
BARE_METAL_POOL = "bare_metal"
CONFIDENTIAL_POOL_SUFFIX = "+cc"


def capacity_pool(pool: str, confidential: bool) -> str:
    """The planner's pool of a node: confidential nodes are a pool of their own (they serve only confidential work)."""
    return pool + CONFIDENTIAL_POOL_SUFFIX if confidential else pool


class Busy(NamedTuple):
    """An existing allocation of (part of) one GPU for a time range (a tuple: a snapshot has thousands)."""

    reservation_id: UUID
    start: datetime
    end: datetime
    mem_lo: int
    mem_hi: int
    preemptible: bool = False  # spot: may be evicted by higher-priority demand
    priority: float = 0.0  # the holder's score, to pick the cheapest victims
    share_class: str = ""  # a time-sliced slot's slice class


@dataclass
class GPUCapacity:
    gpu_id: UUID
    index: int
    memory_mib: int
    busy: list[Busy] = field(default_factory=list)  # sorted by start
    # Where it sits in its node (planner.topology): the GPUs sharing each number share that link; None: not known.
    nvlink_domain: int | None = None
    pcie_switch: int | None = None
    numa_node: int | None = None


@dataclass
class NodeCapacity:
    """A node that may take new work (spares and unsellable nodes are never in a snapshot)."""

    node_id: UUID
    region: str
    fabric_id: UUID
    leaf_id: UUID
    pod: int  # leaves of one pod share spine switches: the "leaf group"
    pool: str  # BARE_METAL_POOL or SHARED_POOL (suffixed for confidential capacity)
    gpu_model_id: UUID
    gpus: list[GPUCapacity]
    # The node's shape (GPUs installed); 0: as many as ``gpus`` (a snapshot of every sellable GPU). A
    # free-only snapshot holds only the free GPUs: a bare-metal node is whole only when they are all.
    installed: int = 0


@dataclass
class Snapshot:
    now: datetime
    nodes: list[NodeCapacity]


@dataclass(frozen=True)
class Request:
    """
    One reservation to place. ``units`` instances of ``gpus_per_unit`` GPUs each; the GPUs of a
    unit are on one node. Bare metal: units are whole nodes (gpus_per_unit = all GPUs of the
    node, no other tenant on it) and a multi-node request goes under as few leaves as possible.
    Fractional (``slots_per_gpu`` > 1): each unit is one slot of one GPU.
    """

    reservation_id: UUID
    kind: str  # BARE_METAL, VM or CONTAINER
    gpu_model_ids: tuple[UUID, ...]  # acceptable GPU models, best first
    regions: tuple[str, ...]  # acceptable regions, preferred first (burst into the next when full)
    units: int
    gpus_per_unit: int
    start: datetime
    end: datetime
    priority: float
    slots_per_gpu: int = 1
    preemptible: bool = False  # this request itself is spot
    on_demand: bool = True  # may use the headroom kept for on-demand bursts
    # Reserved work: it may use the headroom for a window that starts then or later, having waited
    # MERIDIAN_HEADROOM_MAX_WAIT for it (snapshot.request_for); None: never.
    headroom_from: datetime | None = None
    may_preempt: bool = True  # may evict lower-priority spot allocations
    # How a spot victim of this request is evicted: soft gives it a grace period first.
    eviction_grace: timedelta = timedelta(0)
    # Only this fabric (the reservation's VPC lives there); None: any fabric of the region.
    fabric_id: UUID | None = None
    # Confidential: only on confidential capacity (GPUs in CC mode, their pool suffixed "+cc"), and never
    # the other way round.
    confidential: bool = False
    # Time-sliced slots: their slice class; they share GPUs only with slots of the same class and size.
    share_class: str = ""

    @property
    def total_gpus(self) -> int:
        return self.units * self.gpus_per_unit if self.slots_per_gpu == 1 else 0


@dataclass(frozen=True)
class Assignment:
    node_id: UUID
    gpu_id: UUID
    mem_lo: int
    mem_hi: int
    share_class: str = ""


@dataclass(frozen=True)
class Eviction:
    """A spot allocation that must end (at ``at``: now, or now + a grace period) to make room."""

    victim_reservation_id: UUID
    by_reservation_id: UUID
    at: datetime
    reason: str


@dataclass(frozen=True)
class Placement:
    reservation_id: UUID
    region: str
    start: datetime  # may be later than asked when it waits for a soft eviction's grace period
    end: datetime
    assignments: tuple[Assignment, ...]
    leaves: int  # distinct leaf switches used (topology quality)
    evictions: tuple[Eviction, ...] = ()


@dataclass
class Plan:
    placements: list[Placement] = field(default_factory=list)
    unplaced: dict[UUID, str] = field(default_factory=dict)  # reservation id -> why it waits
    cut_short: bool = False  # it stopped at its most placements with requests not yet tried
