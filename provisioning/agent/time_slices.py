"""
Time-sliced GPUs on a node: the slice length the control plane's policy asks for, set and read back.

NVML documents a read of the time slice (the vGPU scheduler state) and, on hosts without a vGPU
manager, offers no call to set a compute time slice: the driver's documented interface there is
``nvidia-smi compute-policy --set-timeslice`` (levels 0 default, 1 short, 2 medium, 3 long). A real
host is given that command (``--time-slice-command``, with ``{index}``, ``{level}`` and ``{ms}``);
where NVML cannot read the slice back, what the command set last is what is in force.
"""

from __future__ import annotations

import subprocess

# Each class's slice (ms) as nvidia-smi's levels: real-time short, batch medium, training long.
LEVELS = {1: "1", 5: "2", 50: "3"}


class TimeSlicer:
    def __init__(self, nvml, command: list[str] | None = None):
        self.nvml, self.command = nvml, command
        self.applied: dict[int, int] = {}  # by GPU index: what the command set, where NVML cannot read it

    def in_force(self, index: int) -> int | None:
        read = self.nvml.time_slice(index)
        return read if read is not None else self.applied.get(index)

    def apply(self, index: int, ms: int) -> str:
        """Put GPU ``index`` on ``ms`` slices unless it is already: "" when in force, else what went wrong."""
        if self.in_force(index) == ms:
            return ""
        if self.command:
            command = [p.replace("{index}", str(index)).replace("{level}", LEVELS.get(ms, "0"))
                       .replace("{ms}", str(ms)) for p in self.command]
            done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)  # noqa: S603
            if done.returncode:
                return f"GPU {index}: the time-slice command failed ({done.returncode}): {done.stderr.strip()[:200]}"
            self.applied[index] = ms
        elif hasattr(self.nvml, "gpus"):  # the simulated NVML keeps the slice itself
            self.nvml.gpus[index].time_slice_ms = ms
        else:
            return "this host has no time-slice command configured (--time-slice-command)"
        now = self.in_force(index)
        return "" if now == ms else f"GPU {index}: the time slice is {now or 'the default'} ms, not {ms} ms"
