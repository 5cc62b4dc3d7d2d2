"""
The acceptance readings a node's agent takes (security.acceptance judges them on the control plane):
NVML at idle for each GPU, then the stress steps. On a real host the stress steps are the
operator's commands, each printing one JSON object:

- ``--stress-command`` (``{index}`` filled in), e.g. a wrapper around ``dcgmi diag -r 3 -i {index}``
  or gpu-burn, prints ``{"stress_tflops": 712.4, "memtest_errors": 0}``;
- ``--fabric-test-command``, e.g. a wrapper running NCCL's ``all_reduce_perf -b 8G -e 8G`` across
  the node's leaf with mpirun and ``ib_write_bw`` to a leaf neighbour, prints
  ``{"nccl_busbw_gbs": 391.0, "ib_bandwidth_gbps": 385.2}``.

Without them a real host reports the stress values as not measured, which fails the checks:
a node is not sold on readings nobody took. Simulated GPUs measure what their model should,
unless a test broke one (``SimulatedGPU.acceptance``).
"""

from __future__ import annotations

import json
import subprocess

from security.acceptance import nominal, nominal_node

# As pynvml numbers them: the SM clock, and "enabled" for ECC and persistence mode.
NVML_CLOCK_SM = 1
NVML_FEATURE_ENABLED = 1


def readings(nvml, index: int, *, model: str = "h100-80gb-sxm") -> dict:
    """What GPU ``index`` measures at idle (NVML), without the stress steps."""
    if hasattr(nvml, "gpus"):
        gpu = nvml.gpus[index]
        xid = gpu.xid or {}
        measured = {**nominal(model, index, driver=nvml.versions()["driver"], vbios=gpu.vbios or ""),
                    "nvlinks_up": (gpu.nvlinks or 0) - len(gpu.nvlinks_down),
                    "retired_pages_pending": bool(xid.get("retired_pages_pending")),
                    "row_remap_failure": bool(xid.get("row_remap_failure")),
                    "temperature_c": nvml.temperature(index), "power_w": nvml.power(index)}
        return {**measured, **gpu.acceptance}
    return _real(nvml, index)


def stress(command: list[str] | None, nvml, index: int) -> dict:
    """The stress steps' results: the operator's command, or on a simulated GPU what ``readings`` gave already."""
    if not command:
        return {} if hasattr(nvml, "gpus") else {"stress_tflops": None, "memtest_errors": None}
    return _json_of([part.replace("{index}", str(index)) for part in command])


def fabric(command: list[str] | None, nvml, model: str) -> dict:
    if hasattr(nvml, "gpus") and not command:
        return nominal_node(model)
    if not command:
        return {"nccl_busbw_gbs": None, "ib_bandwidth_gbps": None}
    return _json_of(command)


def _real(nvml, index: int) -> dict:
    links = nvml.nvlinks(index) or {}
    xid = nvml.xid_errors(index) or {}
    ecc = nvml.device("ECC mode", "nvmlDeviceGetEccMode", index)  # (current, pending)
    persistence = nvml.device("persistence mode", "nvmlDeviceGetPersistenceMode", index)
    try:
        throttle = nvml.device("clock event reasons", "nvmlDeviceGetCurrentClocksEventReasons", index)
    except AttributeError:  # nvidia-ml-py before 12.535 names it after throttling
        throttle = nvml.device("throttle reasons", "nvmlDeviceGetCurrentClocksThrottleReasons", index)
    return {
        "index": index,
        "pcie_generation": nvml.device("PCIe generation", "nvmlDeviceGetMaxPcieLinkGeneration", index),
        "pcie_width": nvml.device("PCIe width", "nvmlDeviceGetCurrPcieLinkWidth", index),
        "nvlinks_up": links.get("up", 0) if links else 0,
        "ecc_enabled": bool(ecc and ecc[0] == NVML_FEATURE_ENABLED),
        "retired_pages_pending": bool(xid.get("retired_pages_pending")),
        "row_remap_failure": bool(xid.get("row_remap_failure")),
        "persistence": persistence == NVML_FEATURE_ENABLED,
        "driver": nvml.versions()["driver"],
        "vbios": nvml.vbios(index),
        "sm_clock_max_mhz": nvml.device("maximum SM clock", "nvmlDeviceGetMaxClockInfo", index, NVML_CLOCK_SM),
        "throttle_reasons": throttle,
        "temperature_c": nvml.temperature(index),
        "power_w": nvml.power(index),
    }


def _json_of(command: list[str]) -> dict:
    done = subprocess.run(command, capture_output=True, text=True, timeout=3600, check=False)  # noqa: S603
    if done.returncode:
        raise RuntimeError(f"{command[0]} failed ({done.returncode}): {done.stderr.strip()[:200]}")
    try:
        answer = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise RuntimeError(f"{command[0]} printed no JSON object on its last line") from None
    if not isinstance(answer, dict):
        raise RuntimeError(f"{command[0]} printed {type(answer).__name__}, not a JSON object")
    return answer
