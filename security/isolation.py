"""
GPU memory isolation, judged out of band: pure evaluation of what runs on each GPU against the
policy the control plane computed from the allocations (no ORM, no I/O; the node agent calls it
each watchdog turn and acts on the result, so no hook inside the tenant's processes is trusted).

A GPU's policy names its owners (instances: a VM's domain or a pod, as the host identifies the
processes' cgroups) with, on a shared GPU, each owner's memory cap; an exclusive or MIG GPU has
one owner; a GPU nobody holds has none. The verdicts:

- ``foreign_process``: a process of no owner of the GPU (another tenant's, or anyone's on an idle
  GPU) -> kill the process;
- ``over_cap``: an owner's processes together hold more memory than its slot -> stop its
  container (its processes on that GPU are killed);
- ``wrong_mig_layout``: a MIG GPU not in the layout its owners were given -> quarantine the GPU;
- ``wrong_time_slice``: a time-sliced GPU whose slice length is not its owners' class (the agent
  could not set it) -> reported: a performance matter, not a breach of memory isolation.

Compliant processes are never touched; an owner sees only its own (the agent reports violations
to the control plane, which tells each tenant about its own instances only).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

EXCLUSIVE, MIG, SHARED = "exclusive", "mig", "shared"
KILL_PROCESS, STOP_CONTAINER, QUARANTINE_GPU, REPORT = "kill_process", "stop_container", "quarantine_gpu", "report"


@dataclass(frozen=True)
class GPUPolicy:
    index: int
    mode: str = EXCLUSIVE
    owners: Mapping[str, int | None] = field(default_factory=dict)  # owner -> memory cap (MiB) or None
    mig_layout: str | None = None  # MIG: the layout the GPU must have, e.g. "7x1g.10gb"
    time_slice_ms: int | None = None  # time-sliced: the slice length its owners' class asks for

    @classmethod
    def from_dict(cls, data: Mapping) -> GPUPolicy:
        slice_ms = data.get("time_slice_ms")
        return cls(index=int(data["index"]), mode=str(data.get("mode", EXCLUSIVE)),
                   owners={str(k): (None if v is None else int(v)) for k, v in dict(data.get("owners", {})).items()},
                   mig_layout=data.get("mig_layout"), time_slice_ms=None if slice_ms is None else int(slice_ms))

    def to_dict(self) -> dict:
        return {"index": self.index, "mode": self.mode, "owners": dict(self.owners), "mig_layout": self.mig_layout,
                "time_slice_ms": self.time_slice_ms}


@dataclass(frozen=True)
class Process:
    pid: int
    owner: str | None  # who the host says runs it (cgroup / VM identity); None: nobody Meridian knows
    used_memory_mib: int


@dataclass(frozen=True)
class Violation:
    index: int
    kind: str
    action: str
    detail: str
    owner: str | None = None
    pids: tuple[int, ...] = ()

    def to_dict(self) -> dict:
        return {**asdict(self), "pids": list(self.pids)}


def evaluate(policy: GPUPolicy, processes: list[Process], mig_layout: str | None = None,
             time_slice_ms: int | None = None) -> list[Violation]:
    """
    Every violation of ``policy`` on one GPU by what runs on it (``mig_layout``, ``time_slice_ms``:
    what the GPU has now).
    """
    found = []
    if policy.time_slice_ms and policy.owners and time_slice_ms != policy.time_slice_ms:
        found.append(Violation(policy.index, "wrong_time_slice", REPORT,
                               f"the GPU runs {time_slice_ms or 'the default'} ms slices, not the "
                               f"{policy.time_slice_ms} ms its tasks' class asks for"))
    # A layout is enforced once the GPU has been handed over in it (policy.mig_layout set).
    if policy.mode == MIG and policy.owners and policy.mig_layout and mig_layout != policy.mig_layout:
        found.append(Violation(policy.index, "wrong_mig_layout", QUARANTINE_GPU,
                               f"the GPU is in MIG layout {mig_layout or 'none'}, not {policy.mig_layout}"))
    foreign = [p for p in processes if p.owner is None or p.owner not in policy.owners]
    for process in foreign:
        whose = f"of {process.owner}" if process.owner else "of no known owner"
        found.append(Violation(policy.index, "foreign_process", KILL_PROCESS,
                               f"process {process.pid} {whose} uses {process.used_memory_mib} MiB of a GPU it was "
                               "not given", owner=process.owner, pids=(process.pid,)))
    used = defaultdict(int)
    pids = defaultdict(list)
    for process in processes:
        if process not in foreign:
            used[process.owner] += process.used_memory_mib
            pids[process.owner].append(process.pid)
    for owner, cap in policy.owners.items():
        if cap is not None and used[owner] > cap:
            found.append(Violation(policy.index, "over_cap", STOP_CONTAINER,
                                   f"{owner} uses {used[owner]} MiB, over its cap of {cap} MiB", owner=owner,
                                   pids=tuple(sorted(pids[owner]))))
    return found
