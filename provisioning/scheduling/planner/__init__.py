"""
The pure placement planner: a Snapshot of capacity and a ranked queue in, a Plan out.

No Django, no clock, no I/O (DESIGN.md "Admission and placement"; STYLE.md 3.1 rule 7). The
scheduler loop and the create-request fast path both call it; services apply what it decides.

Rules it keeps:
  - no two allocations of one GPU overlap in memory and in time (half-open ranges);
  - bare metal takes whole nodes of the bare-metal pool, every GPU free for the whole window,
    under as few leaf switches as possible (one leaf; else the fewest leaves of one pod; else the
    fewest pods), fullest fitting leaf first so whole leaves stay free;
  - VMs and whole-GPU containers best-fit on the shared pool, one node per unit, several units
    under as few leaf switches as bare metal; inside a node a unit takes GPUs that share the best
    link (one NVLink domain, else one PCIe switch, else one NUMA node: ``topology``);
  - fractional containers take slots of GPUs already cut the same way before starting a GPU;
  - a future window is booked as it is: later work only fits in front of it if it ends first;
  - reserved work keeps ``headroom`` of each region's GPUs of a model and pool kind free (or held
    only by spot work) for on-demand work, until it has waited for it (``headroom_from``); spot
    work may use it, and gives it back by eviction to on-demand work that ranks above it;
  - lower-priority spot work may be evicted (fewest, then lowest-priority victims), never by spot.

Modules: ``state`` (the index and every change to it), ``load`` (the headroom's counts of GPUs in
use), ``slots`` (GPU slot layouts), ``fit`` (where a request fits), ``topology`` (which GPUs of a
node a unit takes), ``preempt`` (where it fits by evicting), ``reasons`` (why it waits),
``planning`` (the order of trial, and recording decisions).
"""

from provisioning.scheduling.planner.planning import Planner, plan, uses_headroom

__all__ = ["Planner", "plan", "uses_headroom"]
