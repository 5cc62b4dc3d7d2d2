"""
What the agent reads of its GPUs, through one interface. The simulated backend serves the
embedded default and the tests; the real one (pynvml, from nvidia-ml-py) comes with the GPU
isolation work and is exercised against a patched pynvml and, when one is lent, a real GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SimulatedGPU:
    index: int
    uuid: str
    memory_mib: int
    healthy: bool = True
    used: set = field(default_factory=set)  # memory ranges (lo, hi) a tenant wrote to


class SimulatedNVML:
    """GPUs in memory: inventory, and a scrub that clears what tenants wrote."""

    def __init__(self, gpus: list[SimulatedGPU]):
        self.gpus = {gpu.index: gpu for gpu in gpus}

    def inventory(self) -> list[dict]:
        return [{"index": g.index, "uuid": g.uuid, "memory_mib": g.memory_mib, "healthy": g.healthy,
                 "memory_used_ranges": sorted(g.used)} for g in self.gpus.values()]

    def scrub(self, index: int, mem_lo: int, mem_hi: int) -> bool:
        """Clear the range; True when nothing is left in it (a real scrub resets and re-reads)."""
        gpu = self.gpus[index]
        gpu.used = {(lo, hi) for lo, hi in gpu.used if hi <= mem_lo or lo >= mem_hi}
        return not any(lo < mem_hi and mem_lo < hi for lo, hi in gpu.used)
