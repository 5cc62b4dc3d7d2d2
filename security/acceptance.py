"""
Acceptance checks of a GPU node (NCP-style acceptance, pre-delivery checks and burn-in): what the
node's agent measured, judged against what its GPU model must show. Pure: no database, no I/O.

Per GPU, read from NVML at idle: the PCIe link (generation the link can run, width it runs at),
NVLink links up, ECC mode on and no retired-page or row-remap pressure, persistence mode on, the
driver and VBIOS versions (they must be versions Meridian holds reference values for, the RIMs
the attestation checks), the maximum SM clock (a capped GPU) and the throttle reasons active at
idle (hardware slowdown, thermal or power brake), temperature and power at idle. Then the stress
steps the agent runs: a GPU stress (dense FP16 TFLOPS), a memory test (errors), and per node an
NCCL all-reduce within its leaf (bus bandwidth) and an InfiniBand bandwidth test.

Every check gives a ``Result`` naming the GPU (None: the node), the check, the value measured
and the bound it had to meet; one failed check keeps the node out of sale.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

# NVML's clock-event ("throttle") reasons that mean the hardware is holding the GPU back at idle.
HW_SLOWDOWN, SW_THERMAL, HW_THERMAL, HW_POWER_BRAKE = 0x8, 0x20, 0x40, 0x80
BAD_THROTTLE = {HW_SLOWDOWN: "hardware slowdown", SW_THERMAL: "software thermal slowdown",
                HW_THERMAL: "hardware thermal slowdown", HW_POWER_BRAKE: "power brake"}


@dataclass(frozen=True)
class Profile:
    """What one GPU model must measure. Stress bounds are what a healthy part reaches, with margin."""

    pcie_generation: int
    pcie_width: int
    nvlinks: int
    sm_clock_max_mhz: int
    idle_temperature_c: int
    idle_power_w: float
    stress_tflops: float  # dense FP16 in a sustained GEMM stress
    nccl_busbw_gbs: float  # all-reduce bus bandwidth across the leaf's nodes
    ib_bandwidth_gbps: float  # one port, write bandwidth (ib_write_bw)


PROFILES: dict[str, Profile] = {
    "a100-80gb-sxm": Profile(4, 16, 12, 1410, 50, 90.0, 230.0, 180.0, 180.0),
    "h100-80gb-sxm": Profile(5, 16, 18, 1980, 50, 120.0, 600.0, 350.0, 360.0),
    "h200-141gb-sxm": Profile(5, 16, 18, 1980, 50, 130.0, 600.0, 350.0, 360.0),
    "b200-180gb-sxm": Profile(5, 16, 18, 1965, 50, 200.0, 1500.0, 650.0, 360.0),
}


@dataclass(frozen=True)
class Result:
    gpu: int | None
    check: str
    value: Any
    bound: str
    passed: bool

    def to_dict(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        where = "node" if self.gpu is None else f"GPU {self.gpu}"
        return f"{where}: {self.check} is {self.value}, must be {self.bound}"


def nominal(model: str, index: int, *, driver: str = "", vbios: str = "") -> dict:
    """What a healthy GPU of ``model`` measures (the simulated hosts' readings, before a test breaks one)."""
    p = PROFILES.get(model) or PROFILES["h100-80gb-sxm"]
    return {"index": index, "pcie_generation": p.pcie_generation, "pcie_width": p.pcie_width, "nvlinks_up": p.nvlinks,
            "ecc_enabled": True, "retired_pages_pending": False, "row_remap_failure": False, "persistence": True,
            "driver": driver, "vbios": vbios, "sm_clock_max_mhz": p.sm_clock_max_mhz, "throttle_reasons": 0x1,
            "temperature_c": p.idle_temperature_c - 15, "power_w": round(p.idle_power_w * 0.6, 1),
            "stress_tflops": round(p.stress_tflops * 1.15, 1), "memtest_errors": 0}


def nominal_node(model: str) -> dict:
    p = PROFILES.get(model) or PROFILES["h100-80gb-sxm"]
    return {"nccl_busbw_gbs": round(p.nccl_busbw_gbs * 1.1, 1),
            "ib_bandwidth_gbps": round(p.ib_bandwidth_gbps * 1.05, 1)}


def evaluate(model: str, gpus: Iterable[Mapping], node: Mapping, *,
             known_versions: set[tuple[str, str]] | None = None) -> list[Result]:
    """
    Every check of every GPU and of the node. ``known_versions``: the (VBIOS, driver) pairs
    Meridian holds reference values for; None skips that check (no attestation configured).
    """
    profile = PROFILES.get(model)
    if profile is None:
        return [Result(None, "profile", model, f"a GPU model with an acceptance profile ({', '.join(PROFILES)})",
                       False)]
    results: list[Result] = []
    for gpu in gpus:
        results += _gpu_results(profile, gpu, known_versions)
    results += [
        _at_least(None, "nccl_busbw_gbs", node.get("nccl_busbw_gbs"), profile.nccl_busbw_gbs, "GB/s"),
        _at_least(None, "ib_bandwidth_gbps", node.get("ib_bandwidth_gbps"), profile.ib_bandwidth_gbps, "Gb/s"),
    ]
    return results


def failures(results: Iterable[Result]) -> list[Result]:
    return [result for result in results if not result.passed]


def _gpu_results(p: Profile, gpu: Mapping, known_versions) -> list[Result]:
    i = gpu.get("index")
    throttle = int(gpu.get("throttle_reasons") or 0)
    active = [name for bit, name in BAD_THROTTLE.items() if throttle & bit]
    results = [
        _at_least(i, "pcie_generation", gpu.get("pcie_generation"), p.pcie_generation, "", prefix="Gen"),
        _at_least(i, "pcie_width", gpu.get("pcie_width"), p.pcie_width, "", prefix="x"),
        _at_least(i, "nvlinks_up", gpu.get("nvlinks_up"), p.nvlinks, "links"),
        Result(i, "ecc_mode", "on" if gpu.get("ecc_enabled") else "off", "on", bool(gpu.get("ecc_enabled"))),
        Result(i, "retired_pages", _pressure(gpu), "no page retirement pending and no row-remap failure",
               _pressure(gpu) == "none"),
        Result(i, "persistence_mode", "on" if gpu.get("persistence") else "off", "on", bool(gpu.get("persistence"))),
        _at_least(i, "sm_clock_max_mhz", gpu.get("sm_clock_max_mhz"), p.sm_clock_max_mhz, "MHz"),
        Result(i, "idle_throttle", ", ".join(active) or "none", "none of hardware, thermal or power-brake slowdown",
               not active),
        _at_most(i, "idle_temperature_c", gpu.get("temperature_c"), p.idle_temperature_c, "°C"),
        _at_most(i, "idle_power_w", gpu.get("power_w"), p.idle_power_w, "W"),
        _at_least(i, "stress_tflops", gpu.get("stress_tflops"), p.stress_tflops, "TFLOPS"),
        _at_most(i, "memtest_errors", gpu.get("memtest_errors"), 0, "errors"),
    ]
    if known_versions is not None:
        versions = (str(gpu.get("vbios") or ""), str(gpu.get("driver") or ""))
        results.append(Result(i, "firmware_reference", f"VBIOS {versions[0] or '?'} driver {versions[1] or '?'}",
                              "a version Meridian holds reference values (RIMs) for", versions in known_versions))
    return results


def _pressure(gpu: Mapping) -> str:
    found = [name for name, key in (("page retirement pending", "retired_pages_pending"),
                                    ("row-remap failure", "row_remap_failure")) if gpu.get(key)]
    return ", ".join(found) or "none"


def _at_least(gpu, check, value, bound, unit, prefix="") -> Result:
    shown = f"{prefix}{bound}{' ' + unit if unit else ''}"
    if not isinstance(value, int | float) or isinstance(value, bool):
        return Result(gpu, check, "not measured", f"at least {shown}", False)
    return Result(gpu, check, value, f"at least {shown}", value >= bound)


def _at_most(gpu, check, value, bound, unit) -> Result:
    if not isinstance(value, int | float) or isinstance(value, bool):
        return Result(gpu, check, "not measured", f"at most {bound} {unit}", False)
    return Result(gpu, check, value, f"at most {bound} {unit}", value <= bound)
