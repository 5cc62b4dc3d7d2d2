"""
A read-only probe of the real NVML backend on a real GPU: inventory, processes, memory, ECC, the
XID traces, VBIOS, MIG mode and versions, checked for shape and printed as one JSON summary (also
written to the file named by NVML_PROBE_JSON, when set). It needs only pytest and nvidia-ml-py;
run it from the repository root, outside the Django test setup:

    python -m pytest -p no:django -p no:cacheprovider -c /dev/null --rootdir . --confcutdir tests/device \\
        tests/device/test_nvml_probe.py -q -s

(``-c /dev/null`` leaves out the project's pytest settings, which name Django; ``--confcutdir``
keeps tests/conftest.py, which imports Django, from loading.) Without an NVIDIA driver or GPU it
skips, so the normal test run collects it harmlessly.

It changes nothing on the GPU: every pynvml function other than init, shutdown and the getters
is replaced, for the probe's duration, by one that fails the test.
"""

import json
import os
import re

import pytest

pynvml = pytest.importorskip("pynvml", reason="nvidia-ml-py is not installed")

from provisioning.agent import acceptance  # noqa: E402 -- only once pynvml is known
from provisioning.agent.nvml import NVMLUnavailable, RealNVML  # noqa: E402
from security.acceptance import evaluate  # noqa: E402

READ_ONLY = re.compile(r"^nvml(Init\w*|Shutdown|ErrorString|\w*Get\w*)$")
XID_KEYS = {"recovery_action", "retired_pages_pending", "row_remap_pending", "row_remap_failure"}


def forbid_state_changes(monkeypatch) -> list[str]:
    """Every pynvml call that could change the GPU (set, reset, clear, create, register...) fails instead."""
    blocked = [name for name in dir(pynvml) if name.startswith("nvml") and callable(getattr(pynvml, name))
               and not isinstance(getattr(pynvml, name), type) and not READ_ONLY.match(name)]
    for name in blocked:
        monkeypatch.setattr(pynvml, name, _refuse(name))
    return blocked


def _refuse(name):
    def refuse(*args, **kwargs):
        raise AssertionError(f"{name} could change GPU state; the NVML probe is read-only")
    return refuse


@pytest.fixture(scope="module")
def nvml():
    with pytest.MonkeyPatch.context() as monkeypatch:
        assert "nvmlDeviceSetMigMode" in forbid_state_changes(monkeypatch)
        try:
            backend = RealNVML()
        except NVMLUnavailable as exc:
            pytest.skip(f"no usable NVIDIA driver or GPU here: {exc}")
        try:
            if not backend.inventory():
                pytest.skip("NVML is up but sees no GPU")
            yield backend
        finally:
            backend.shutdown()


@pytest.fixture(scope="module")
def summary(nvml) -> dict:
    """Every reading, once."""
    gpus = nvml.inventory()
    readings = {gpu["index"]: {"memory": nvml.memory(gpu["index"]), "processes": nvml.processes(gpu["index"]),
                               "ecc": nvml.ecc(gpu["index"]), "xid": nvml.xid_errors(gpu["index"]),
                               "vbios": nvml.vbios(gpu["index"]), "mig_mode": nvml.mig_mode(gpu["index"]),
                               "time_slice_ms": nvml.time_slice(gpu["index"]),
                               "nvlinks": nvml.nvlinks(gpu["index"]),
                               "acceptance": acceptance.readings(nvml, gpu["index"])}
                for gpu in gpus}
    return {"versions": nvml.versions(), "cc_mode": nvml.cc_mode(),
            "gpus": [{**gpu, **readings[gpu["index"]]} for gpu in gpus]}


def test_inventory_names_every_gpu(summary):
    for gpu in summary["gpus"]:
        assert gpu["uuid"].startswith(("GPU-", "MIG-")), gpu
        assert gpu["name"] and isinstance(gpu["healthy"], bool)
        assert gpu["serial"] is None or isinstance(gpu["serial"], str)


def test_memory_is_consistent(summary):
    for gpu in summary["gpus"]:
        memory = gpu["memory"]
        assert memory["total_mib"] == gpu["memory_mib"] > 0
        assert 0 <= memory["used_mib"] <= memory["total_mib"] and 0 <= memory["free_mib"] <= memory["total_mib"]


def test_processes_have_pids(summary):
    for gpu in summary["gpus"]:
        for process in gpu["processes"] or []:
            assert process["pid"] > 0 and process["types"], process
            assert process["used_memory_mib"] is None or 0 <= process["used_memory_mib"] <= gpu["memory_mib"]


def test_error_counters_are_counts_or_absent(summary):
    for gpu in summary["gpus"]:
        assert gpu["ecc"] is None or all(isinstance(n, int) and n >= 0 for n in gpu["ecc"].values()), gpu["ecc"]
        assert gpu["xid"] is None or set(gpu["xid"]) == XID_KEYS, gpu["xid"]
        assert gpu["mig_mode"] is None or all(isinstance(mode, bool) for mode in gpu["mig_mode"])
        # Without a vGPU manager the driver's default slice is in force and not readable: None.
        assert gpu["time_slice_ms"] is None or gpu["time_slice_ms"] >= 1


def test_nvlinks_are_counted_or_absent(summary):
    """An SXM GPU has its links (18 on an H100 or H200), each up or down; a PCIe card has none (None)."""
    for gpu in summary["gpus"]:
        links = gpu["nvlinks"]
        assert links is None or 0 <= links["up"] <= links["total"] <= 36, links


def test_the_cc_mode_is_a_state_not_a_crash(summary):
    """A GPU without confidential computing on (the likely case on a lent machine) is "off", not an error."""
    assert summary["cc_mode"] in ("on", "devtools", "off")


def test_acceptance_readings_are_measured_and_judged(summary):
    """NVML's idle readings of each GPU, judged by the H200 profile (the stress steps are not run here)."""
    for gpu in summary["gpus"]:
        reading = gpu["acceptance"]
        assert reading["pcie_generation"] is None or 1 <= reading["pcie_generation"] <= 6, reading
        assert reading["pcie_width"] is None or 1 <= reading["pcie_width"] <= 32, reading
        assert isinstance(reading["ecc_enabled"], bool) and isinstance(reading["persistence"], bool)
        results = evaluate("h200-141gb-sxm", [reading], {})
        gpu["acceptance_results"] = [str(result) for result in results if not result.passed]


def test_versions_are_read(summary):
    assert summary["versions"]["driver"], summary["versions"]
    assert summary["versions"]["cuda_driver"] is None or re.fullmatch(r"\d+\.\d+", summary["versions"]["cuda_driver"])


def test_print_the_summary(summary):
    text = json.dumps(summary, indent=2, sort_keys=True)
    print(text)
    if os.environ.get("NVML_PROBE_JSON"):
        with open(os.environ["NVML_PROBE_JSON"], "w") as out:
            out.write(text + "\n")
