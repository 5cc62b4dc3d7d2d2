"""
The NVML backends. RealNVML runs here against pynvml with its functions replaced by fakes over a
table of two GPUs, so it is tested everywhere, GPU or not: str and bytes answers, readings a GPU
does not support, a missing library, processes, MIG mode, the telemetry readings (utilization,
temperature, power) and XIDs from NVML's event set. The simulated backend's readings and knobs
follow, then the host's InfiniBand ports read from a fake /sys.
tests/device/test_nvml_probe.py reads a real GPU when there is one.
"""

import sys
from types import SimpleNamespace

import pynvml
import pytest

from provisioning.agent.agent import Agent
from provisioning.agent.nvml import (
    NVMLBackend,
    NVMLReadError,
    NVMLUnavailable,
    RealNVML,
    SimulatedGPU,
    SimulatedNVML,
)

MIB = 1024 * 1024


def not_supported():
    return pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)


def fields_answer(answers: dict):
    """A real c_nvmlFieldValue_t array, as nvmlDeviceGetFieldValues returns it; an answer of None is unsupported."""
    def read(handle, field_ids):
        values = (pynvml.c_nvmlFieldValue_t * len(field_ids))()
        for slot, field_id in zip(values, field_ids, strict=True):
            slot.fieldId, answer = field_id, answers.get(field_id)
            slot.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED if answer is None else pynvml.NVML_SUCCESS
            slot.valueType, slot.value.ullVal = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, answer or 0
        return values
    return read


def table() -> list[dict]:
    """GPU 0 answers everything in str; GPU 1 answers in bytes (an old nvidia-ml-py) and supports little."""
    return [
        {"uuid": "GPU-00000000-aaaa-bbbb-cccc-000000000000", "name": "NVIDIA H100 80GB HBM3", "serial": "1650123456789",
         "vbios": "96.00.99.00.01", "memory": (81559 * MIB, 2048 * MIB), "ecc": {0: 3, 1: 0}, "mig": [1, 0],
         "compute": [SimpleNamespace(pid=4242, usedGpuMemory=2048 * MIB),
                     SimpleNamespace(pid=4343, usedGpuMemory=None)],
         "graphics": [SimpleNamespace(pid=4242, usedGpuMemory=1024 * MIB)],
         "fields": {pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: 0, pynvml.NVML_FI_DEV_RETIRED_PENDING: 0,
                    pynvml.NVML_FI_DEV_REMAPPED_PENDING: 0, pynvml.NVML_FI_DEV_REMAPPED_FAILURE: 0},
         "utilization": 37, "temperature": 54, "power": 412_345, "xid_events": None,
         "scheduler": SimpleNamespace(schedulerParams=SimpleNamespace(vgpuSchedData=SimpleNamespace(
             timeslice=5_000_000))),  # a vGPU host: 5 ms slices, in ns
         "nvlink": [pynvml.NVML_FEATURE_ENABLED] * 17 + [pynvml.NVML_FEATURE_DISABLED]},  # 18 links, one down
        {"uuid": b"GPU-11111111-aaaa-bbbb-cccc-111111111111", "name": b"NVIDIA A10", "serial": not_supported(),
         "vbios": b"94.02.5C.00.01", "memory": (22731 * MIB, 0), "ecc": not_supported(), "mig": not_supported(),
         "compute": [], "graphics": not_supported(), "fields": {pynvml.NVML_FI_DEV_REMAPPED_PENDING: 0},
         "utilization": not_supported(), "temperature": 61, "power": not_supported(), "xid_events": not_supported(),
         "scheduler": not_supported(),
         "nvlink": not_supported()},  # a PCIe card: no NVLink
    ]


class FakeNVML:
    """The pynvml functions RealNVML calls, answered from ``gpus``; an exception in the table is raised."""

    def __init__(self, gpus: list[dict]):
        self.gpus, self.calls = gpus, []
        self.events: list = []  # XID events waiting in the event set, as (GPU handle, XID)

    def answer(self, value):
        if isinstance(value, Exception):
            raise value
        return value

    def install(self, monkeypatch) -> None:
        def device(key, transform=lambda v: v):
            return lambda handle, *args: transform(self.answer(self.gpus[handle][key]), *args)

        functions = {
            "nvmlInit": lambda: self.calls.append("init"),
            "nvmlShutdown": lambda: self.calls.append("shutdown"),
            "nvmlDeviceGetCount": lambda: len(self.gpus),
            "nvmlDeviceGetHandleByIndex": lambda index: index,
            "nvmlDeviceGetUUID": device("uuid"),
            "nvmlDeviceGetName": device("name"),
            "nvmlDeviceGetSerial": device("serial"),
            "nvmlDeviceGetVbiosVersion": device("vbios"),
            "nvmlDeviceGetMigMode": device("mig"),
            "nvmlDeviceGetVgpuSchedulerState": device("scheduler"),
            "nvmlDeviceGetComputeRunningProcesses": device("compute"),
            "nvmlDeviceGetGraphicsRunningProcesses": device("graphics"),
            "nvmlDeviceGetMemoryInfo": device("memory", lambda m: pynvml.c_nvmlMemory_t(
                total=m[0], used=m[1], free=m[0] - m[1])),
            "nvmlDeviceGetTotalEccErrors": device("ecc", lambda counts, error_type, counter: counts[error_type]),
            "nvmlDeviceGetFieldValues": lambda handle, ids: fields_answer(self.gpus[handle]["fields"])(handle, ids),
            "nvmlDeviceGetUtilizationRates": device("utilization", lambda gpu: pynvml.c_nvmlUtilization_t(
                gpu=gpu, memory=0)),
            "nvmlDeviceGetTemperature": device("temperature", lambda celsius, sensor: celsius),
            "nvmlDeviceGetPowerUsage": device("power"),
            "nvmlDeviceGetNvLinkState": self.nvlink_state,
            "nvmlEventSetCreate": lambda: self.calls.append("event_set") or "the-event-set",
            "nvmlDeviceRegisterEvents": self.register,
            "nvmlEventSetWait_v2": self.wait,
            "nvmlEventSetFree": lambda event_set: self.calls.append("event_free"),
            "nvmlSystemGetDriverVersion": lambda: "570.124.06",
            "nvmlSystemGetNVMLVersion": lambda: b"12.570.124.06",
            "nvmlSystemGetCudaDriverVersion": lambda: 12080,
        }
        for name, function in functions.items():
            monkeypatch.setattr(pynvml, name, function)

    def nvlink_state(self, handle, link):
        """A link's state; past the GPU's last link NVML answers "invalid argument", as it does."""
        states = self.answer(self.gpus[handle]["nvlink"])
        if link >= len(states):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return states[link]

    def register(self, handle, types, event_set):
        assert (types, event_set) == (pynvml.nvmlEventTypeXidCriticalError, "the-event-set")
        self.answer(self.gpus[handle]["xid_events"])

    def wait(self, event_set, timeout_ms):
        """nvmlEventSetWait_v2 without waiting: the next event, or NVML_ERROR_TIMEOUT when none is left."""
        assert timeout_ms == 0
        if not self.events:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
        handle, xid = self.events.pop(0)
        return SimpleNamespace(device=handle, eventType=pynvml.nvmlEventTypeXidCriticalError, eventData=xid)


@pytest.fixture
def fake(monkeypatch) -> FakeNVML:
    nvml = FakeNVML(table())
    nvml.install(monkeypatch)
    return nvml


@pytest.fixture
def real(fake) -> RealNVML:
    backend = RealNVML()
    yield backend
    backend.shutdown()


def test_both_backends_are_nvml_backends(real):
    assert isinstance(real, NVMLBackend)
    assert isinstance(SimulatedNVML([]), NVMLBackend)


def test_inventory_decodes_str_and_bytes_and_leaves_unsupported_readings_empty(real):
    first, second = real.inventory()
    assert first == {"index": 0, "uuid": "GPU-00000000-aaaa-bbbb-cccc-000000000000", "name": "NVIDIA H100 80GB HBM3",
                     "serial": "1650123456789", "memory_mib": 81559, "healthy": True}
    assert second == {"index": 1, "uuid": "GPU-11111111-aaaa-bbbb-cccc-111111111111", "name": "NVIDIA A10",
                      "serial": None, "memory_mib": 22731, "healthy": True}


def test_processes_merge_compute_and_graphics_by_pid(real):
    assert real.processes(0) == [{"pid": 4242, "used_memory_mib": 2048, "types": ["compute", "graphics"]},
                                 {"pid": 4343, "used_memory_mib": None, "types": ["compute"]}]
    assert real.processes(1) == []  # graphics not supported, no compute process


def test_processes_are_none_when_neither_list_is_supported(fake, real):
    fake.gpus[1]["compute"] = not_supported()
    assert real.processes(1) is None


def test_the_time_slice_is_read_where_the_driver_offers_it_and_the_default_elsewhere(real):
    assert real.time_slice(0) == 5
    assert real.time_slice(1) is None  # no vGPU scheduler: the driver's default, not readable


def test_memory_ecc_vbios_mig_and_versions(real):
    assert real.memory(0) == {"total_mib": 81559, "used_mib": 2048, "free_mib": 79511}
    assert real.ecc(0) == {"corrected": 3, "uncorrected": 0}
    assert real.ecc(1) is None  # NVMLError_NotSupported: no crash, no reading
    assert (real.vbios(0), real.vbios(1)) == ("96.00.99.00.01", "94.02.5C.00.01")
    assert real.mig_mode(0) == (True, False)  # enabled, and disabling is pending a reset
    assert real.mig_mode(1) is None
    assert real.versions() == {"driver": "570.124.06", "nvml": "12.570.124.06", "cuda_driver": "12.8"}


def test_xid_traces_are_read_per_field(real):
    assert real.xid_errors(0) == {"recovery_action": "none", "retired_pages_pending": False,
                                  "row_remap_pending": False, "row_remap_failure": False}
    assert real.xid_errors(1) == {"recovery_action": None, "retired_pages_pending": None,
                                  "row_remap_pending": False, "row_remap_failure": None}


def test_utilization_temperature_and_power_are_read_or_none(real):
    assert (real.utilization(0), real.temperature(0), real.power(0)) == (37, 54, 412.3)  # milliwatts to watts
    assert (real.utilization(1), real.temperature(1), real.power(1)) == (None, 61, None)


def test_xids_since_the_last_call_come_from_nvml_events_once_each(fake, real):
    """The first call registers every GPU for critical-XID events; each call drains them without waiting."""
    assert real.xids(0) == [] and real.xids(1) is None  # GPU 1 cannot report XID events
    fake.events += [(0, 79), (1, 48), (0, 13)]
    assert real.xids(0) == [79, 13]
    assert real.xids(0) == []  # reported once
    fake.events.append((0, 94))
    assert real.xids(1) is None and real.xids(0) == [94]
    real.shutdown()
    assert fake.calls == ["init", "event_set", "event_free", "shutdown"]


def test_an_event_error_other_than_a_timeout_names_the_reading(fake, monkeypatch, real):
    def lost(event_set, timeout_ms):
        raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)

    monkeypatch.setattr(pynvml, "nvmlEventSetWait_v2", lost)
    with pytest.raises(NVMLReadError, match="XID events"):
        real.xids(0)


def test_the_agent_samples_every_gpu_through_the_real_backend(fake, real):
    fake.events.append((0, 79))
    samples = Agent(None, real).samples(real.inventory())
    assert samples == [
        {"uuid": "GPU-00000000-aaaa-bbbb-cccc-000000000000", "utilization_pct": 37, "memory_used_mib": 2048,
         "memory_total_mib": 81559, "temperature_c": 54, "power_w": 412.3, "ecc_corrected": 3, "ecc_uncorrected": 0,
         "processes": 2, "nvlink_up": 17, "nvlink_total": 18, "time_slice_ms": 5, "xids": [79]},
        {"uuid": "GPU-11111111-aaaa-bbbb-cccc-111111111111", "utilization_pct": None, "memory_used_mib": 0,
         "memory_total_mib": 22731, "temperature_c": 61, "power_w": None, "ecc_corrected": None,
         "ecc_uncorrected": None, "processes": 0, "nvlink_up": None, "nvlink_total": None, "time_slice_ms": None,
         "xids": []},
    ]


def test_nvlinks_count_the_links_a_gpu_has_and_those_up(fake, real):
    assert real.nvlinks(0) == {"up": 17, "total": 18}
    assert real.nvlinks(1) is None  # no NVLink: every link "not supported"
    fake.gpus[0]["nvlink"] = pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
    with pytest.raises(NVMLReadError, match="NVLink 0 state of GPU 0"):
        real.nvlinks(0)


def test_a_gpu_whose_readings_fail_is_left_out_of_the_samples(fake, real):
    fake.gpus[1]["temperature"] = pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
    assert [s["uuid"] for s in Agent(None, real).samples(real.inventory())] == [
        "GPU-00000000-aaaa-bbbb-cccc-000000000000"]


def test_xid_reading_is_none_when_no_field_is_offered(fake, real):
    fake.gpus[1]["fields"] = {}
    assert real.xid_errors(1) is None


@pytest.mark.parametrize(("change", "reason"), [
    (lambda gpu: gpu.update(ecc={0: 0, 1: 2}), "uncorrected ECC"),
    (lambda gpu: gpu["fields"].update({pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: 1}), "asks for a reset"),
    (lambda gpu: gpu["fields"].update({pynvml.NVML_FI_DEV_REMAPPED_FAILURE: 1}), "row remapping failed"),
    (lambda gpu: gpu["fields"].update({pynvml.NVML_FI_DEV_RETIRED_PENDING: 1}), "pages pending retirement"),
])
def test_a_gpu_with_errors_is_not_healthy(fake, real, change, reason):
    change(fake.gpus[0])
    assert [gpu["healthy"] for gpu in real.inventory()] == [False, True], reason


def test_a_function_the_driver_lacks_is_an_empty_reading(monkeypatch, real):
    def missing():
        raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlSystemGetCudaDriverVersion", missing)
    assert real.versions()["cuda_driver"] is None


def test_other_nvml_errors_name_the_reading_and_the_gpu(fake, real):
    fake.gpus[1]["memory"] = pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
    with pytest.raises(NVMLReadError, match="memory of GPU 1: GPU is lost"):
        real.memory(1)
    with pytest.raises(LookupError, match="no GPU 7"):
        real.ecc(7)


@pytest.mark.parametrize(("code", "hint"), [
    (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "install the NVIDIA driver, which provides libnvidia-ml.so.1"),
    (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "load the NVIDIA kernel driver"),
    (pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH, "reload the driver"),
])
def test_init_without_a_usable_library_says_what_to_install_or_check(fake, monkeypatch, code, hint):
    def fail():
        raise pynvml.NVMLError(code)

    monkeypatch.setattr(pynvml, "nvmlInit", fail)
    with pytest.raises(NVMLUnavailable, match="NVML could not start") as raised:
        RealNVML()
    assert hint in str(raised.value)
    assert isinstance(raised.value.__cause__, pynvml.NVMLError)


def test_without_nvidia_ml_py_the_error_names_the_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml now raises ImportError
    with pytest.raises(NVMLUnavailable, match=r"pip install nvidia-ml-py"):
        RealNVML()


def test_init_once_and_shutdown_once(fake):
    with RealNVML() as backend:
        backend.inventory()
        backend.versions()
    backend.shutdown()
    assert fake.calls == ["init", "shutdown"]


def test_a_failed_device_listing_still_shuts_nvml_down(fake, monkeypatch):
    def lost(index):
        raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByIndex", lost)
    with pytest.raises(NVMLReadError, match="handle of GPU 0"):
        RealNVML()
    assert fake.calls == ["init", "shutdown"]


def test_the_agent_reports_real_inventory_and_refuses_a_real_scrub(real):
    agent = Agent(None, real)
    assert [gpu["uuid"] for gpu in agent.execute({"id": "c1", "kind": "inventory"})["gpus"]] == [
        "GPU-00000000-aaaa-bbbb-cccc-000000000000", "GPU-11111111-aaaa-bbbb-cccc-111111111111"]
    answer = agent.execute({"id": "c2", "kind": "scrub", "payload": {"devices": [{"index": 0, "mem_lo": 0,
                                                                                   "mem_hi": 1024}]}})
    assert answer["ok"] is False and answer["detail"].startswith("NotImplementedError: RealNVML does not scrub")


# The simulated backend


def simulated() -> SimulatedNVML:
    return SimulatedNVML([
        SimulatedGPU(index=0, uuid="GPU-sim-0", memory_mib=81920, serial="S0",
                     processes=[{"pid": 7, "used_memory_mib": 1000}, {"pid": 8, "used_memory_mib": 24}]),
        SimulatedGPU(index=1, uuid="GPU-sim-1", memory_mib=81920, ecc=None, xid=None, mig=(True, True)),
    ])


def test_simulated_inventory_keeps_its_used_ranges_and_adds_identity():
    nvml = simulated()
    nvml.gpus[1].used.add((0, 512))
    assert nvml.inventory()[1] == {"index": 1, "uuid": "GPU-sim-1", "name": "Simulated GPU", "serial": None,
                                   "memory_mib": 81920, "healthy": True, "memory_used_ranges": [(0, 512)]}
    assert nvml.scrub(1, 0, 1024) is True and nvml.inventory()[1]["memory_used_ranges"] == []


def test_simulated_readings_follow_the_processes_tests_add():
    nvml = simulated()
    assert nvml.processes(0) == [{"pid": 7, "used_memory_mib": 1000, "types": ["compute"]},
                                 {"pid": 8, "used_memory_mib": 24, "types": ["compute"]}]
    assert nvml.memory(0) == {"total_mib": 81920, "used_mib": 1024, "free_mib": 80896}
    nvml.gpus[1].processes.append({"pid": 9, "used_memory_mib": 4096})
    assert nvml.memory(1)["used_mib"] == 4096


def test_simulated_unsupported_readings_are_none_like_the_real_ones():
    nvml = simulated()
    assert nvml.ecc(0) == {"corrected": 0, "uncorrected": 0} and nvml.ecc(1) is None
    assert nvml.xid_errors(0)["recovery_action"] == "none" and nvml.xid_errors(1) is None
    assert (nvml.mig_mode(0), nvml.mig_mode(1)) == (None, (True, True))
    assert nvml.vbios(0) and set(nvml.versions()) == {"driver", "nvml", "cuda_driver"}


def test_simulated_samples_follow_their_knobs_deterministically():
    nvml = simulated()
    assert (nvml.utilization(0), nvml.temperature(0), nvml.power(0)) == (0, 32, 70.0)  # idle
    nvml.set_utilization(0, 100)
    assert (nvml.utilization(0), nvml.temperature(0), nvml.power(0)) == (100, 68, 700.0)
    nvml.overheat(0, 97)
    assert nvml.temperature(0) == 97
    nvml.overheat(0, None)
    assert nvml.temperature(0) == 68
    nvml.inject_xid(1, 79)
    nvml.inject_xid(1, 13)
    assert nvml.xids(1) == [79, 13] and nvml.xids(1) == []
    nvml.raise_ecc(0, uncorrected=1, corrected=4)
    assert nvml.ecc(0) == {"corrected": 4, "uncorrected": 1} and nvml.inventory()[0]["healthy"] is False
    assert nvml.nvlinks(0) == {"up": 18, "total": 18}
    nvml.nvlink_down(0, 3)
    assert nvml.nvlinks(0) == {"up": 17, "total": 18}
    nvml.nvlink_down(0, 3, down=False)
    assert nvml.nvlinks(0)["up"] == 18


def test_sysfs_ports_read_infiniband_ports_and_skip_others(tmp_path):
    from provisioning.agent.ports import SysfsPorts

    def port(hca, number, state, layer="InfiniBand", gid="fe80:0000:0000:0000:b83f:d203:0012:3456"):
        folder = tmp_path / hca / "ports" / str(number)
        (folder / "gids").mkdir(parents=True)
        (folder / "state").write_text(state + "\n")
        (folder / "link_layer").write_text(layer + "\n")
        (folder / "gids" / "0").write_text(gid + "\n")

    port("mlx5_0", 1, "4: ACTIVE")
    port("mlx5_1", 1, "1: DOWN", gid="fe80:0000:0000:0000:b83f:d203:0012:3457")
    port("mlx5_2", 1, "4: ACTIVE", layer="Ethernet", gid="fe80:0000:0000:0000:0000:0000:0000:0001")
    assert SysfsPorts(tmp_path).states() == [{"guid": "b83fd20300123456", "link": "up"},
                                             {"guid": "b83fd20300123457", "link": "down"}]
    assert SysfsPorts(tmp_path / "none").states() == []
