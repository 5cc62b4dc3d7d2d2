"""
What the agent reads of its GPUs, through one interface (``NVMLBackend``) with two implementations:

- ``SimulatedNVML``: GPUs in memory, for the embedded default and the tests.
- ``RealNVML``: pynvml, from nvidia-ml-py, imported only when it is used so that the agent runs
  without it. It is tested against a patched pynvml and, when one is lent, a real GPU
  (tests/device/test_nvml_probe.py).

Every reading is read-only. A reading the GPU or driver does not offer is None, never a crash:
the control plane decides what a missing reading means.
"""

from __future__ import annotations

import contextlib
import ctypes
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from provisioning.agent.topology import RealReadings, SimulatedReadings

MIB = 1024 * 1024
RECOVERY_ACTIONS = dict(enumerate(("none", "gpu_reset", "node_reboot", "drain_p2p", "drain_and_reset",
                                    "recover_imex_domain", "bus_reset", "system_reboot")))


@runtime_checkable
class NVMLBackend(Protocol):
    """
    The agent's view of its GPUs. ``index`` is NVML's device index. Readings that return None mean
    "not offered by this GPU or driver".

    - ``inventory()``: one dict per GPU: index, uuid, name, serial, memory_mib, healthy.
    - ``processes(index)``: compute and graphics processes merged, one dict per pid: pid,
      used_memory_mib (None where the driver hides it), types.
    - ``memory(index)``: total_mib, used_mib, free_mib.
    - ``ecc(index)``: volatile totals since the driver loaded: corrected, uncorrected.
    - ``xid_errors(index)``: NVML's read-only traces of serious XIDs (see ``RealNVML.xid_errors``).
    - ``utilization(index)`` (percent of time a kernel ran), ``temperature(index)`` (°C of the
      GPU die), ``power(index)`` (watts drawn).
    - ``xids(index)``: the XID codes the GPU raised since the last call (each is reported once).
    - ``nvlinks(index)``: NVLink links active (up) and present (total); None without NVLink.
    - ``versions()``: driver, nvml, cuda_driver.
    - ``vbios(index)``, ``mig_mode(index)`` -> (current, pending) as booleans.
    - ``time_slice(index)``: the compute time slice in force in ms (None: the driver's default,
      or not readable on this host).
    - ``scrub(index, mem_lo, mem_hi)``: True when the range holds nothing of a tenant's afterwards.

    Where each GPU sits in the node (NVLink, PCIe switch, NUMA node) is read by agent.topology.
    """

    def inventory(self) -> list[dict]: ...

    def processes(self, index: int) -> list[dict] | None: ...

    def memory(self, index: int) -> dict | None: ...

    def ecc(self, index: int) -> dict | None: ...

    def xid_errors(self, index: int) -> dict | None: ...

    def utilization(self, index: int) -> int | None: ...

    def temperature(self, index: int) -> int | None: ...

    def power(self, index: int) -> float | None: ...

    def xids(self, index: int) -> list[int] | None: ...

    def nvlinks(self, index: int) -> dict | None: ...

    def versions(self) -> dict: ...

    def vbios(self, index: int) -> str | None: ...

    def mig_mode(self, index: int) -> tuple[bool, bool] | None: ...

    def time_slice(self, index: int) -> int | None: ...

    def scrub(self, index: int, mem_lo: int, mem_hi: int) -> bool: ...


class NVMLUnavailable(RuntimeError):
    """NVML cannot be used on this host at all (no nvidia-ml-py, no library, no driver)."""


class NVMLReadError(RuntimeError):
    """A reading failed for a reason other than "not supported" (a lost GPU, a permission)."""


def healthy_from(ecc: dict | None, xid: dict | None) -> bool:
    """
    A GPU is fit for the next tenant unless it reports an uncorrected ECC error since the driver
    loaded, asks for a recovery action, or has memory that failed or waits to be remapped or retired.
    Readings a GPU does not offer count as nothing wrong: their absence is visible on their own.
    """
    if ecc and (ecc.get("uncorrected") or 0) > 0:
        return False
    if not xid:
        return True
    return (
        xid.get("recovery_action") in (None, "none")
        and not xid.get("row_remap_failure")
        and not xid.get("row_remap_pending")
        and not xid.get("retired_pages_pending")
    )


@dataclass
class SimulatedGPU:
    index: int
    uuid: str
    memory_mib: int
    healthy: bool = True
    used: set = field(default_factory=set)  # memory ranges (lo, hi) a tenant wrote to
    name: str = "Simulated GPU"
    serial: str | None = None
    vbios: str | None = "96.00.9f.00.01"  # the simulated fleet's firmware (simulated_devices): it validates
    processes: list[dict] = field(default_factory=list)  # {"pid", "used_memory_mib"}, as tests need them
    ecc: dict | None = field(default_factory=lambda: {"corrected": 0, "uncorrected": 0})
    xid: dict | None = field(
        default_factory=lambda: {
            "recovery_action": "none",
            "retired_pages_pending": False,
            "row_remap_pending": False,
            "row_remap_failure": False,
        }
    )
    mig: tuple[bool, bool] | None = None
    utilization_pct: int = 0
    temperature_c: int | None = None  # None: follows the utilization (``SimulatedNVML.temperature``)
    power_w: float | None = None  # None: follows the utilization
    tdp_w: float = 700.0
    pending_xids: list[int] = field(default_factory=list)  # raised, not yet read by ``xids``
    nvlinks: int | None = 18  # links present (an SXM H100 has 18); None: a GPU without NVLink
    nvlinks_down: set = field(default_factory=set)  # link numbers down
    time_slice_ms: int | None = None  # None: the driver's default
    acceptance: dict = field(default_factory=dict)  # acceptance readings a test broke, e.g. {"pcie_width": 8}
    topology: dict = field(default_factory=dict)  # its place in the node: agent.topology.SimulatedReadings


IDLE_C, FULL_LOAD_C, IDLE_W = 32, 68, 70.0


class SimulatedNVML(SimulatedReadings):
    """
    GPUs in memory: the readings of ``NVMLBackend``, and a scrub that clears what tenants wrote.
    Readings are deterministic: temperature and power follow the utilization a test sets, unless
    a knob fixes them (``overheat``). The knobs (``set_utilization``, ``inject_xid``,
    ``raise_ecc``, ``overheat``) are what tests and the demo use to make a GPU misbehave.
    """

    def __init__(self, gpus: list[SimulatedGPU], *, versions: dict | None = None):
        self.gpus = {gpu.index: gpu for gpu in gpus}
        self._versions = versions or {"driver": "570.124.06", "nvml": "12.570.124.06", "cuda_driver": "12.8"}

    def inventory(self) -> list[dict]:
        return [
            {
                "index": g.index,
                "uuid": g.uuid,
                "name": g.name,
                "serial": g.serial,
                "memory_mib": g.memory_mib,
                "healthy": g.healthy,
                "memory_used_ranges": sorted(g.used),
            }
            for g in self.gpus.values()
        ]

    def processes(self, index: int) -> list[dict]:
        return [
            {"pid": p["pid"], "used_memory_mib": p.get("used_memory_mib"), "types": p.get("types", ["compute"])}
            for p in self.gpus[index].processes
        ]

    def memory(self, index: int) -> dict:
        """Used memory is what the simulated processes hold."""
        gpu = self.gpus[index]
        used = min(gpu.memory_mib, sum(p.get("used_memory_mib") or 0 for p in gpu.processes))
        return {"total_mib": gpu.memory_mib, "used_mib": used, "free_mib": gpu.memory_mib - used}

    def ecc(self, index: int) -> dict | None:
        return None if self.gpus[index].ecc is None else dict(self.gpus[index].ecc)

    def xid_errors(self, index: int) -> dict | None:
        return None if self.gpus[index].xid is None else dict(self.gpus[index].xid)

    def utilization(self, index: int) -> int | None:
        return self.gpus[index].utilization_pct

    def temperature(self, index: int) -> int | None:
        gpu = self.gpus[index]
        if gpu.temperature_c is not None:
            return gpu.temperature_c
        return IDLE_C + round((FULL_LOAD_C - IDLE_C) * gpu.utilization_pct / 100)

    def power(self, index: int) -> float | None:
        gpu = self.gpus[index]
        if gpu.power_w is not None:
            return gpu.power_w
        return round(IDLE_W + (gpu.tdp_w - IDLE_W) * gpu.utilization_pct / 100, 1)

    def xids(self, index: int) -> list[int] | None:
        gpu = self.gpus[index]
        raised, gpu.pending_xids = gpu.pending_xids, []
        return raised

    def nvlinks(self, index: int) -> dict | None:
        gpu = self.gpus[index]
        if gpu.nvlinks is None:
            return None
        return {"up": gpu.nvlinks - len({link for link in gpu.nvlinks_down if link < gpu.nvlinks}),
                "total": gpu.nvlinks}

    # Knobs for tests and the demo

    def nvlink_down(self, index: int, link: int, down: bool = True) -> None:
        """Take NVLink ``link`` of the GPU down (or back up)."""
        (self.gpus[index].nvlinks_down.add if down else self.gpus[index].nvlinks_down.discard)(int(link))

    def set_utilization(self, index: int, percent: int) -> None:
        self.gpus[index].utilization_pct = max(0, min(100, int(percent)))

    def inject_xid(self, index: int, code: int) -> None:
        """The GPU raises XID ``code`` (reported in the next heartbeat's sample, once)."""
        self.gpus[index].pending_xids.append(int(code))

    def raise_ecc(self, index: int, *, uncorrected: int = 1, corrected: int = 0) -> None:
        """More ECC errors on the GPU's volatile counters (an uncorrected one makes it unhealthy)."""
        gpu = self.gpus[index]
        gpu.ecc = {
            "corrected": (gpu.ecc or {}).get("corrected", 0) + corrected,
            "uncorrected": (gpu.ecc or {}).get("uncorrected", 0) + uncorrected,
        }
        gpu.healthy = healthy_from(gpu.ecc, gpu.xid)

    def overheat(self, index: int, celsius: int | None = 95) -> None:
        """Fix the GPU's temperature (None: back to following its utilization)."""
        self.gpus[index].temperature_c = celsius

    def versions(self) -> dict:
        return dict(self._versions)

    def vbios(self, index: int) -> str | None:
        return self.gpus[index].vbios

    def mig_mode(self, index: int) -> tuple[bool, bool] | None:
        return self.gpus[index].mig

    def time_slice(self, index: int) -> int | None:
        return self.gpus[index].time_slice_ms

    def scrub(self, index: int, mem_lo: int, mem_hi: int) -> bool:
        """Clear the range; True when nothing is left in it (a real scrub resets and re-reads)."""
        gpu = self.gpus[index]
        gpu.used = {(lo, hi) for lo, hi in gpu.used if hi <= mem_lo or lo >= mem_hi}
        return not any(lo < mem_hi and mem_lo < hi for lo, hi in gpu.used)


def _text(value) -> str | None:
    """nvidia-ml-py returns str in current versions and bytes in old ones; None stays None (not offered)."""
    if value is None:
        return None
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _address(handle):
    """A device handle's identity: pynvml hands out pointers (compare their addresses); fakes, plain values."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return handle


def _cuda_version(number: int) -> str:
    """NVML encodes CUDA 12.8 as 12080."""
    return f"{number // 1000}.{number % 1000 // 10}"


def _unavailable_hint(pynvml, error) -> str:
    """What an operator should install or check, by the reason NVML gave."""
    hints = {
        pynvml.NVML_ERROR_LIBRARY_NOT_FOUND: "install the NVIDIA driver, which provides libnvidia-ml.so.1",
        pynvml.NVML_ERROR_DRIVER_NOT_LOADED: "load the NVIDIA kernel driver (check `nvidia-smi` and `lsmod`)",
        pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH: "the NVML library and kernel driver differ: reload the driver "
        "or reboot after the driver upgrade",
        pynvml.NVML_ERROR_NO_PERMISSION: "run the agent as a user that may open /dev/nvidia*",
    }
    return hints.get(getattr(error, "value", None), "check that `nvidia-smi` works on this host")


class RealNVML(RealReadings):
    """
    NVML through pynvml (nvidia-ml-py). ``nvmlInit`` runs once, here; ``shutdown`` ends it. Handles
    are taken by index once. A reading NVML reports as not supported (or a function the installed
    driver lacks) is None; any other NVML error is an ``NVMLReadError`` naming the reading and GPU.
    """

    UNSUPPORTED = ("NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_FUNCTION_NOT_FOUND")

    def __init__(self, pynvml=None):
        self._nvml = pynvml or self._import()
        self._unsupported = {getattr(self._nvml, name) for name in self.UNSUPPORTED}
        self._init()
        self._open = True
        self._events = None  # the XID event set, made on the first ``xids`` call
        self._xid_gpus: set[int] = set()  # GPUs registered for XID events
        self._raised: dict[int, list[int]] = {}  # XIDs drained from the set, not yet asked for
        try:
            count = self._read("device count", self._nvml.nvmlDeviceGetCount)
            self._handles = {
                i: self._read(f"handle of GPU {i}", self._nvml.nvmlDeviceGetHandleByIndex, i) for i in range(count or 0)
            }
        except NVMLReadError:
            self.shutdown()
            raise

    @staticmethod
    def _import():
        try:
            import pynvml
        except ImportError as exc:
            raise NVMLUnavailable(
                "The real NVML backend needs nvidia-ml-py (`pip install nvidia-ml-py`), "
                "which provides the pynvml module."
            ) from exc
        return pynvml

    def _init(self) -> None:
        try:
            self._nvml.nvmlInit()
        except self._nvml.NVMLError as exc:
            raise NVMLUnavailable(f"NVML could not start ({exc}): {_unavailable_hint(self._nvml, exc)}.") from exc

    def shutdown(self) -> None:
        """End NVML once (the XID event set first); later calls do nothing."""
        if self._open:
            self._open = False
            if self._events not in (None, False):
                with contextlib.suppress(self._nvml.NVMLError):  # NVML ends next, which frees it anyway
                    self._nvml.nvmlEventSetFree(self._events)
                self._events = None
            self._nvml.nvmlShutdown()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info) -> None:
        self.shutdown()

    def _handle(self, index: int):
        if index not in self._handles:
            raise LookupError(f"NVML has no GPU {index} (it sees {len(self._handles)})")
        return self._handles[index]

    def _read(self, what: str, call, *args):
        """One NVML call: None where unsupported, a clear error otherwise."""
        try:
            return call(*args)
        except self._nvml.NVMLError as exc:
            if getattr(exc, "value", None) in self._unsupported:
                return None
            raise NVMLReadError(f"NVML {what}: {exc}") from exc

    def device(self, what: str, name: str, index: int, *args):
        """One NVML call on GPU ``index`` (None where unsupported; NVMLReadError naming the reading otherwise)."""
        return self._read(f"{what} of GPU {index}", getattr(self._nvml, name), self._handle(index), *args)

    def inventory(self) -> list[dict]:
        return [self._describe(index) for index in sorted(self._handles)]

    def _describe(self, index: int) -> dict:
        memory = self.memory(index)
        return {
            "index": index,
            "uuid": _text(self.device("UUID", "nvmlDeviceGetUUID", index)),
            "name": _text(self.device("name", "nvmlDeviceGetName", index)),
            "serial": _text(self.device("serial", "nvmlDeviceGetSerial", index)),
            "memory_mib": None if memory is None else memory["total_mib"],
            "healthy": healthy_from(self.ecc(index), self.xid_errors(index)),
        }

    def processes(self, index: int) -> list[dict] | None:
        """Compute and graphics processes, one entry per pid (a process can be both); None if neither is offered."""
        lists = {
            kind: self.device(f"{kind} processes", name, index)
            for kind, name in (
                ("compute", "nvmlDeviceGetComputeRunningProcesses"),
                ("graphics", "nvmlDeviceGetGraphicsRunningProcesses"),
            )
        }
        if all(found is None for found in lists.values()):
            return None
        merged: dict[int, dict] = {}
        for kind, found in lists.items():
            for process in found or []:
                used = getattr(process, "usedGpuMemory", None)
                entry = merged.setdefault(process.pid, {"pid": process.pid, "used_memory_mib": None, "types": []})
                entry["types"].append(kind)
                if used is not None:
                    entry["used_memory_mib"] = max(entry["used_memory_mib"] or 0, used // MIB)
        return [merged[pid] for pid in sorted(merged)]

    def memory(self, index: int) -> dict | None:
        info = self.device("memory", "nvmlDeviceGetMemoryInfo", index)
        if info is None:
            return None
        return {"total_mib": info.total // MIB, "used_mib": info.used // MIB, "free_mib": info.free // MIB}

    def nvlinks(self, index: int) -> dict | None:
        """
        NVLink links active and present, by asking each possible link its state: a link a GPU does
        not have answers "invalid argument" (or "not supported", as a GPU without NVLink does for
        all of them); None when it has none.
        """
        nvml, handle = self._nvml, self._handle(index)
        absent = self._unsupported | {nvml.NVML_ERROR_INVALID_ARGUMENT}
        up = total = 0
        for link in range(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18)):
            try:
                state = nvml.nvmlDeviceGetNvLinkState(handle, link)
            except nvml.NVMLError as exc:
                if getattr(exc, "value", None) in absent:
                    continue
                raise NVMLReadError(f"NVML NVLink {link} state of GPU {index}: {exc}") from exc
            total += 1
            up += state == nvml.NVML_FEATURE_ENABLED
        return {"up": up, "total": total} if total else None

    def ecc(self, index: int) -> dict | None:
        """Volatile totals (since the driver loaded); None where ECC is off or not offered."""
        counts = {
            key: self.device(
                f"{key} ECC errors", "nvmlDeviceGetTotalEccErrors", index, error_type, self._nvml.NVML_VOLATILE_ECC
            )
            for key, error_type in (
                ("corrected", self._nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED),
                ("uncorrected", self._nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED),
            )
        }
        return None if all(v is None for v in counts.values()) else counts

    def xid_errors(self, index: int) -> dict | None:
        """
        NVML keeps no read-only XID history: XIDs reach NVML only as events, which need a registered
        event set and see only XIDs after it, and the history itself is in the kernel log. What NVML
        does keep, and ``nvmlDeviceGetFieldValues`` reads without side effects, is what serious XIDs
        leave behind: the recovery action the driver asks for (XIDs 79, 119, 154...), pages pending
        retirement (XIDs 48, 63, 64) and row remapping pending or failed (XIDs 94, 95). Each is None
        where not offered; the whole reading is None when none is.
        """
        nvml = self._nvml
        fields = {
            "recovery_action": nvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION,
            "retired_pages_pending": nvml.NVML_FI_DEV_RETIRED_PENDING,
            "row_remap_pending": nvml.NVML_FI_DEV_REMAPPED_PENDING,
            "row_remap_failure": nvml.NVML_FI_DEV_REMAPPED_FAILURE,
        }
        values = self.device("XID-related fields", "nvmlDeviceGetFieldValues", index, list(fields.values()))
        if values is None:
            return None
        read = {key: self._field_value(value) for key, value in zip(fields, values, strict=True)}
        if all(v is None for v in read.values()):
            return None
        action = read.pop("recovery_action")
        return {
            "recovery_action": None if action is None else RECOVERY_ACTIONS.get(action, str(action)),
            **{key: None if value is None else bool(value) for key, value in read.items()},
        }

    def _field_value(self, value):
        """A field's own status says whether it is offered; the value sits in the union member its type names."""
        if value.nvmlReturn != self._nvml.NVML_SUCCESS:
            return None
        members = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")
        return getattr(value.value, members[value.valueType]) if 0 <= value.valueType < len(members) else None

    def utilization(self, index: int) -> int | None:
        rates = self.device("utilization", "nvmlDeviceGetUtilizationRates", index)
        return None if rates is None else int(rates.gpu)

    def temperature(self, index: int) -> int | None:
        celsius = self.device("temperature", "nvmlDeviceGetTemperature", index, self._nvml.NVML_TEMPERATURE_GPU)
        return None if celsius is None else int(celsius)

    def power(self, index: int) -> float | None:
        milliwatts = self.device("power draw", "nvmlDeviceGetPowerUsage", index)
        return None if milliwatts is None else round(milliwatts / 1000, 1)

    def xids(self, index: int) -> list[int] | None:
        """
        The XIDs GPU ``index`` raised since the last call, from NVML's critical-XID events: the
        first call registers every GPU on one event set (seeing only XIDs from then on, which is
        why this is asked every heartbeat); each call drains the set without waiting. Registering
        changes nothing on the GPU. None when the GPU cannot report XID events.
        """
        self._handle(index)
        if self._events is None:
            self._xid_register()
        if index not in self._xid_gpus:
            return None
        nvml = self._nvml
        while True:
            try:
                event = nvml.nvmlEventSetWait_v2(self._events, 0)
            except nvml.NVMLError as exc:
                if getattr(exc, "value", None) == nvml.NVML_ERROR_TIMEOUT:
                    break  # nothing (more) waiting
                raise NVMLReadError(f"NVML XID events: {exc}") from exc
            if event.eventType & nvml.nvmlEventTypeXidCriticalError:
                raised_on = self._index_of(event.device)
                if raised_on is not None:
                    self._raised.setdefault(raised_on, []).append(int(event.eventData))
        return self._raised.pop(index, [])

    def _xid_register(self) -> None:
        nvml = self._nvml
        self._events = self._read("XID event set", nvml.nvmlEventSetCreate)
        if self._events is None:
            self._events = False  # events not offered at all: every GPU's xids are None
            return
        for index, handle in self._handles.items():
            try:
                nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, self._events)
            except nvml.NVMLError as exc:
                if getattr(exc, "value", None) in self._unsupported:
                    continue  # this GPU cannot report XID events: its xids stay None
                raise NVMLReadError(f"NVML XID events of GPU {index}: {exc}") from exc
            self._xid_gpus.add(index)

    def _index_of(self, device) -> int | None:
        wanted = _address(device)
        return next((index for index, handle in self._handles.items() if _address(handle) == wanted), None)

    def versions(self) -> dict:
        nvml = self._nvml
        driver = self._read("driver version", nvml.nvmlSystemGetDriverVersion)
        library = self._read("NVML version", nvml.nvmlSystemGetNVMLVersion)
        cuda = self._read("CUDA driver version", nvml.nvmlSystemGetCudaDriverVersion)
        return {
            "driver": _text(driver),
            "nvml": _text(library),
            "cuda_driver": None if cuda is None else _cuda_version(cuda),
        }

    def vbios(self, index: int) -> str | None:
        return _text(self.device("VBIOS version", "nvmlDeviceGetVbiosVersion", index))

    def mig_mode(self, index: int) -> tuple[bool, bool] | None:
        """(current, pending): a pending mode differs from the current one until the GPU is reset."""
        modes = self.device("MIG mode", "nvmlDeviceGetMigMode", index)
        if modes is None:
            return None
        current, pending = modes
        enabled = self._nvml.NVML_DEVICE_MIG_ENABLE
        return current == enabled, pending == enabled

    def time_slice(self, index: int) -> int | None:
        """
        NVML's documented read of the time slice (the vGPU scheduler state, in ns) on a host whose
        driver offers it; elsewhere (no vGPU manager) NOT_SUPPORTED, read as None: the default.
        """
        try:
            state = self.device("time slice", "nvmlDeviceGetVgpuSchedulerState", index)
        except (NVMLReadError, AttributeError):  # no vGPU scheduler on this host, or an older library
            return None
        slice_ns = getattr(getattr(getattr(state, "schedulerParams", None), "vgpuSchedData", None), "timeslice", 0)
        return max(1, round(slice_ns / 1_000_000)) if slice_ns else None

    def cc_mode(self) -> str:
        """The host's confidential-computing mode: on, devtools or off (off too where NVML or the GPUs lack CC)."""
        state = self._read("confidential-computing state", self._nvml.nvmlSystemGetConfComputeState)
        if state is None or state.ccFeature != self._nvml.NVML_CC_SYSTEM_FEATURE_ENABLED:
            return "off"
        return "devtools" if state.devToolsMode == self._nvml.NVML_CC_SYSTEM_DEVTOOLS_MODE_ON else "on"

    def cc_evidence(self, index: int, nonce: bytes) -> tuple[bytes, bytes]:
        """The GPU's SPDM attestation report for ``nonce`` (32 bytes) and its attestation certificate chain (PEM)."""
        report = self.device("attestation report", "nvmlDeviceGetConfComputeGpuAttestationReport", index, nonce)
        chain = self.device("attestation certificates", "nvmlDeviceGetConfComputeGpuCertificate", index)
        if report is None or chain is None:
            raise NVMLReadError(f"GPU {index} gives no attestation report: its driver does not support CC")
        return (bytes(report.attestationReport[:report.attestationReportSize]),
                bytes(chain.attestationCertChain[:chain.attestationCertChainSize]))

    def scrub(self, index: int, mem_lo: int, mem_hi: int) -> bool:
        """
        Not done through NVML: clearing a GPU needs a reset, which needs privileges and is the
        host's configured scrub command, run outside this backend.
        """
        raise NotImplementedError(
            f"RealNVML does not scrub GPU {index}: a scrub is a GPU reset, run by the "
            "host's configured scrub command, not through NVML reads."
        )
