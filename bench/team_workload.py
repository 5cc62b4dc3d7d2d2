"""
A synthetic multi-tenant workload for the planner: many teams, whole-leaf bare-metal gangs, small
VMs and containers, no-shows and early releases at the Alibaba trace's rates, advance
reservations, offered above capacity. Pure and seeded: the same arguments give the same jobs.
``bench/team_replay.py`` replays it (``bench/trace_replay.py --workload teams``).

Fleet. ``nodes`` nodes of 8 GPUs of one model, one region, one fabric, 32 nodes to a leaf switch,
8 leaves to a pod. The first leaves are the bare-metal pool, the rest the shared pool (VM and
container hosts): ``shared_share`` of the leaves (``SHARED_SHARE``, half: 20 of the 1,280-node
fleet's 40), more than the 40 % of the demand it serves, so the work with a latency goal has
headroom and the gangs' pool takes the excess; 0.4 splits in proportion to the demand. Spares are
not modelled (they are never sellable).

Work, by booked GPU-hours (``CATEGORIES``):
  - gang 50 %: bare metal of 8, 16 or 32 whole nodes (64, 128, 256 GPUs; 32 nodes fill a leaf);
  - mid 10 %: bare metal of 2 or 4 nodes (16, 32 GPUs);
  - small 40 %: VMs of 1, 2, 4 or 8 GPUs and whole-GPU containers of 1, 2 or 4.
Booked durations are log-normal per category (median and spread in ``CATEGORIES``), clipped.
Each category draws jobs until their booked GPU-hours reach its share of ``load`` x the fleet's
GPU-hours in the horizon, submitted uniformly over it (a Poisson process given the count), so the
fleet is offered ``load`` in booked GPU-hours (a pool: its categories' share over its share of the
leaves). A share of each category books a future window (an advance reservation), 2 to 48 h after
it is submitted.

Teams. ``TEAMS`` teams with Zipf-like weights (team i: 1 / (i + 1) ** 0.8); every third team
trains (runs the gangs, and twice its share of mid and small work). ``HIGH_PRIORITY`` teams (two
training, two not) hold approved high-priority status. A team's quota is 1.5 x the GPUs its
demand holds on average: it only scales the score's load and fair-share terms (nothing is refused).
Each request asks low, normal or high urgency (20 / 60 / 20 %).

Outcomes, at the trace's rates (``measure_rates``): of the GPU tasks that ran, those that failed
within their first minute never used their GPUs (a no-show: held until Meridian's default no-show
policy reclaims it, 15 min grace + 10 min warning, or its booked end if sooner); those that failed
later released early (the trace has no booked end to compare with, so the share of the booking
used is uniform in (0, 1)); the rest use their whole booking.
"""

from __future__ import annotations

import csv
import math
import random
from dataclasses import dataclass, field
from pathlib import Path

from provisioning.scheduling.plan_types import BARE_METAL, BARE_METAL_POOL, CONTAINER, SHARED_POOL, VM
from provisioning.scheduling.priority import URGENCY_LEVELS

GPUS_PER_NODE = 8
NODES_PER_LEAF = 32
LEAVES_PER_POD = 8
HOUR = 3600.0
DAY = 86400.0

NO_SHOW_S = 60.0  # a trace task that failed within this long after starting never used its GPUs
NO_SHOW_HOLD_S = (15 + 10) * 60.0  # Meridian's default policy: 15 min grace, then a 10 min warning
TEAMS = 48
HIGH_PRIORITY = (3, 9, 14, 31)  # teams 3 and 9 train, 14 and 31 do not
QUOTA_FACTOR = 1.5
URGENCY_MIX = ((URGENCY_LEVELS["low"], 0.2), (URGENCY_LEVELS["normal"], 0.6), (URGENCY_LEVELS["high"], 0.2))
LEAD_H = (2.0, 48.0)  # an advance reservation's window starts this long after it is submitted
GANG_GPUS = 64  # work of this many GPUs or more is a gang; the latency goal is for work under it
# The shared pool's share of the leaves: more than the 40 % of the demand it serves, so the work with
# a latency goal has headroom and the gangs' pool takes the excess (0.4 splits in proportion).
SHARED_SHARE = 0.5

OUTCOMES = ("used", "early", "no_show")


@dataclass(frozen=True)
class Category:
    name: str
    pool: str
    share: float  # of the booked GPU-hours
    shapes: tuple[tuple[str, int, int, float], ...]  # (kind, units, GPUs per unit, weight by count)
    median_h: float
    sigma: float
    clip_h: tuple[float, float]
    advance: float  # share that books a future window
    trainers_only: bool  # only training teams ask for it (else all, trainers twice as often)


CATEGORIES = (
    Category("gang", BARE_METAL_POOL, 0.50, ((BARE_METAL, 8, 8, 0.45), (BARE_METAL, 16, 8, 0.35),
                                             (BARE_METAL, 32, 8, 0.20)),
             median_h=12.0, sigma=0.6, clip_h=(2.0, 96.0), advance=0.15, trainers_only=True),
    Category("mid", BARE_METAL_POOL, 0.10, ((BARE_METAL, 2, 8, 0.6), (BARE_METAL, 4, 8, 0.4)),
             median_h=6.0, sigma=0.8, clip_h=(1.0, 72.0), advance=0.10, trainers_only=False),
    Category("small", SHARED_POOL, 0.40, ((VM, 1, 1, 0.30), (VM, 1, 2, 0.12), (VM, 1, 4, 0.10), (VM, 1, 8, 0.15),
                                          (CONTAINER, 1, 1, 0.20), (CONTAINER, 1, 2, 0.08), (CONTAINER, 1, 4, 0.05)),
             median_h=2.0, sigma=1.0, clip_h=(0.25, 48.0), advance=0.03, trainers_only=False),
)


@dataclass(frozen=True)
class TraceRates:
    """How the trace's GPU tasks that ran ended: never used (no-show), ended early, or as planned."""

    tasks: int
    no_show: float
    early_release: float

    @property
    def used(self) -> float:
        return 1.0 - self.no_show - self.early_release


def measure_rates(path: Path) -> TraceRates:
    """
    The rates in the normalised Alibaba jobs CSV: GPU tasks (``num_gpu`` >= 1) that ran (a positive
    ``duration_s``; ``Pending`` ones never did); ``Failed`` within ``NO_SHOW_S`` is a no-show,
    ``Failed`` later an early release.
    """
    ran = no_show = early = 0
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            if int(row["num_gpu"] or 0) < 1 or not row["duration_s"] or float(row["duration_s"]) <= 0:
                continue
            ran += 1
            if row["status"] == "Failed":
                if float(row["duration_s"]) <= NO_SHOW_S:
                    no_show += 1
                else:
                    early += 1
    if not ran:
        raise ValueError(f"{path} holds no GPU task that ran")
    return TraceRates(tasks=ran, no_show=no_show / ran, early_release=early / ran)


@dataclass(frozen=True)
class Team:
    index: int
    weight: float
    trains: bool
    high_priority: bool
    quota_gpus: int = 0


class Job:
    """One reservation: what it asks for, when, and how it will be used once it holds its GPUs."""

    __slots__ = ("idx", "team", "category", "kind", "units", "gpus_per_unit", "gpus", "submit", "start_at",
                 "booked_s", "outcome", "used_s", "held_s", "urgency",
                 "start", "placement", "leaves", "released", "tries")

    def __init__(self, idx: int, team: int, category: Category, shape: tuple, submit: float, start_at: float,
                 booked_s: float, outcome: str, used_share: float, urgency: float):
        self.idx = idx
        self.team = team
        self.category = category
        self.kind, self.units, self.gpus_per_unit, _ = shape
        self.gpus = self.units * self.gpus_per_unit
        self.submit = submit
        self.start_at = start_at  # later than submit: an advance reservation
        self.booked_s = booked_s
        self.outcome = outcome
        self.used_s = booked_s * used_share
        # How long it holds its GPUs once started: a no-show until the policy reclaims it.
        self.held_s = max(1.0, min(booked_s, NO_SHOW_HOLD_S) if outcome == "no_show" else self.used_s)
        self.urgency = urgency
        self.start: float | None = None  # the simulation fills these in
        self.placement = None
        self.leaves = 0
        self.released = False
        # Cycles it did not fit in, by what was free now (team_loop.BLOCKED: the simulation fills it in).
        self.tries = [0, 0, 0]

    @property
    def advance(self) -> bool:
        return self.start_at > self.submit

    @property
    def pool(self) -> str:
        return self.category.pool


@dataclass
class Workload:
    nodes: int
    bare_metal_leaves: int
    load: float
    horizon_s: float
    rates: TraceRates
    teams: list[Team]
    jobs: list[Job]
    info: dict = field(default_factory=dict)

    @property
    def gpus(self) -> int:
        return self.nodes * GPUS_PER_NODE

    def pool_gpus(self, pool: str) -> int:
        bare = min(self.nodes, self.bare_metal_leaves * NODES_PER_LEAF) * GPUS_PER_NODE
        return bare if pool == BARE_METAL_POOL else self.gpus - bare


def bare_metal_leaves(nodes: int, shared_share: float) -> int:
    """The bare-metal pool's leaves: those not in the shared pool's share, in whole leaves, at least one each."""
    leaves = math.ceil(nodes / NODES_PER_LEAF)
    return max(1, min(leaves - 1, leaves - round(leaves * shared_share)))


def booked_hours(category: Category, rng: random.Random) -> float:
    lo, hi = category.clip_h
    return min(hi, max(lo, category.median_h * math.exp(rng.gauss(0.0, category.sigma))))


def make_teams(count: int = TEAMS, high_priority: tuple[int, ...] = HIGH_PRIORITY) -> list[Team]:
    raw = [1.0 / (i + 1) ** 0.8 for i in range(count)]
    total = sum(raw)
    return [Team(index=i, weight=w / total, trains=i % 3 == 0, high_priority=i in high_priority)
            for i, w in enumerate(raw)]


def team_weights(teams: list[Team], category: Category) -> list[float]:
    if category.trainers_only:
        return [t.weight if t.trains else 0.0 for t in teams]
    return [t.weight * (2.0 if t.trains else 1.0) for t in teams]


def generate(rates: TraceRates, *, nodes: int = 1280, load: float = 1.2, days: float = 6.0,
             seed: int = 1, teams: int = TEAMS, shared_share: float = SHARED_SHARE) -> Workload:
    """Every job submitted in ``[0, days)``, ordered by submission, ids from 0 in that order."""
    if nodes < 2 * NODES_PER_LEAF:
        raise ValueError(f"the fleet needs at least two leaves ({2 * NODES_PER_LEAF} nodes), not {nodes}")
    rng = random.Random(seed)
    horizon = days * DAY
    team_list = make_teams(teams, tuple(i for i in HIGH_PRIORITY if i < teams))
    fleet_gpus = nodes * GPUS_PER_NODE
    drafts = []
    info = {"categories": {}}
    mean_gpus_held = [0.0] * len(team_list)
    for category in CATEGORIES:
        target = category.share * load * fleet_gpus * horizon  # booked GPU-seconds to offer
        weights = team_weights(team_list, category)
        total_w = sum(weights)
        for t in team_list:
            mean_gpus_held[t.index] += category.share * load * fleet_gpus * weights[t.index] / total_w
        shape_w = [s[3] for s in category.shapes]
        offered_s = 0.0
        count = 0
        while offered_s < target:
            # Submitted uniformly over the horizon: a Poisson process given how many jobs it holds.
            t = rng.uniform(0.0, horizon)
            shape = rng.choices(category.shapes, shape_w)[0]
            team = rng.choices(team_list, weights)[0].index
            booked = booked_hours(category, rng) * HOUR
            start_at = t + rng.uniform(*LEAD_H) * HOUR if rng.random() < category.advance else t
            draw = rng.random()
            outcome = ("no_show" if draw < rates.no_show
                       else "early" if draw < rates.no_show + rates.early_release else "used")
            used_share = {"no_show": 0.0, "early": rng.random(), "used": 1.0}[outcome]
            urgency = rng.choices([u for u, _ in URGENCY_MIX], [w for _, w in URGENCY_MIX])[0]
            drafts.append((t, category, team, shape, start_at, booked, outcome, used_share, urgency))
            offered_s += shape[1] * shape[2] * booked
            count += 1
        info["categories"][category.name] = {"jobs": count, "per_hour": count / (horizon / HOUR),
                                             "mean_booked_gpu_h": offered_s / count / HOUR}
    drafts.sort(key=lambda d: (d[0], d[1].name))
    jobs = [Job(i, team, category, shape, t, start_at, booked, outcome, used_share, urgency)
            for i, (t, category, team, shape, start_at, booked, outcome, used_share, urgency) in enumerate(drafts)]
    team_list = [Team(t.index, t.weight, t.trains, t.high_priority,
                      quota_gpus=max(GPUS_PER_NODE, math.ceil(QUOTA_FACTOR * mean_gpus_held[t.index])))
                 for t in team_list]
    workload = Workload(nodes=nodes, bare_metal_leaves=bare_metal_leaves(nodes, shared_share), load=load,
                        horizon_s=horizon, rates=rates, teams=team_list, jobs=jobs, info=info)
    info["offered_booked"] = offered(workload, lambda j: j.booked_s)
    info["offered_used"] = offered(workload, lambda j: j.used_s)
    info["offered_held"] = offered(workload, lambda j: j.held_s)
    return workload


def offered(workload: Workload, seconds) -> dict[str, float]:
    """GPU-seconds submitted per pool (``seconds(job)`` each) over the pool's GPU-seconds in the horizon."""
    out = {}
    for pool in (BARE_METAL_POOL, SHARED_POOL):
        work = sum(j.gpus * seconds(j) for j in workload.jobs if j.pool == pool)
        out[pool] = work / (workload.pool_gpus(pool) * workload.horizon_s)
    out["fleet"] = sum(j.gpus * seconds(j) for j in workload.jobs) / (workload.gpus * workload.horizon_s)
    return out
