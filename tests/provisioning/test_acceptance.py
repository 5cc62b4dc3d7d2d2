"""
Validation that measures: the acceptance checks per GPU model (security.acceptance, pure), the
burn-in that runs them (a node failing one check is not sold, every check recorded for staff),
and the agent's readings (simulated GPUs; a real host's stress steps through its commands).
"""

from __future__ import annotations

import json
import sys

import pynvml
import pytest

from cloud.catalogue import GPU_MODELS
from cloud.models import Node
from provisioning.agent import acceptance as agent_acceptance
from provisioning.agent.agent import Agent
from provisioning.agent.nvml import RealNVML, SimulatedGPU, SimulatedNVML
from provisioning.drivers.simulated import SimulatedHost
from provisioning.lifecycle import validate as validating
from provisioning.lifecycle.steps import target_of
from provisioning.models import NodeValidation, Operation
from security.acceptance import PROFILES, evaluate, failures, nominal, nominal_node
from tests.provisioning.test_nvml_backend import FakeNVML, table
from tests.world import small_fleet

H100 = "h100-80gb-sxm"


def healthy(n=8):
    return [nominal(H100, i, driver="570.1", vbios="96.00.9f.00.01") for i in range(n)]


def test_a_healthy_h100_node_passes_every_check():
    results = evaluate(H100, healthy(), nominal_node(H100), known_versions={("96.00.9f.00.01", "570.1")})

    assert failures(results) == []
    assert len(results) == 8 * 13 + 2


@pytest.mark.parametrize("change, check, value, bound", [
    ({"pcie_width": 8}, "pcie_width", 8, "at least x16"),
    ({"pcie_generation": 4}, "pcie_generation", 4, "at least Gen5"),
    ({"nvlinks_up": 17}, "nvlinks_up", 17, "at least 18 links"),
    ({"ecc_enabled": False}, "ecc_mode", "off", "on"),
    ({"retired_pages_pending": True}, "retired_pages", "page retirement pending",
     "no page retirement pending and no row-remap failure"),
    ({"persistence": False}, "persistence_mode", "off", "on"),
    ({"sm_clock_max_mhz": 1410}, "sm_clock_max_mhz", 1410, "at least 1980 MHz"),
    ({"throttle_reasons": 0x40 | 0x1}, "idle_throttle", "hardware thermal slowdown",
     "none of hardware, thermal or power-brake slowdown"),
    ({"temperature_c": 71}, "idle_temperature_c", 71, "at most 50 °C"),
    ({"power_w": 300.0}, "idle_power_w", 300.0, "at most 120.0 W"),
    ({"stress_tflops": 410.0}, "stress_tflops", 410.0, "at least 600.0 TFLOPS"),
    ({"memtest_errors": 3}, "memtest_errors", 3, "at most 0 errors"),
    ({"vbios": "96.00.00.00.99"}, "firmware_reference", "VBIOS 96.00.00.00.99 driver 570.1",
     "a version Meridian holds reference values (RIMs) for"),
    ({"stress_tflops": None}, "stress_tflops", "not measured", "at least 600.0 TFLOPS"),
])
def test_a_failed_check_names_the_gpu_the_check_the_value_and_the_bound(change, check, value, bound):
    gpus = healthy()
    gpus[3] = {**gpus[3], **change}

    failed = failures(evaluate(H100, gpus, nominal_node(H100), known_versions={("96.00.9f.00.01", "570.1")}))

    assert [(r.gpu, r.check, r.value, r.bound) for r in failed] == [(3, check, value, bound)]
    assert str(failed[0]).startswith(f"GPU 3: {check} is ")


def test_the_node_checks_are_the_leafs_all_reduce_and_the_ib_bandwidth():
    failed = failures(evaluate(H100, healthy(), {"nccl_busbw_gbs": 120.0, "ib_bandwidth_gbps": None}))

    assert [(r.gpu, r.check, r.value) for r in failed] == [(None, "nccl_busbw_gbs", 120.0),
                                                          (None, "ib_bandwidth_gbps", "not measured")]


def test_every_catalogue_model_has_a_profile_and_an_unknown_one_fails_clearly():
    assert {row["slug"] for row in GPU_MODELS} <= PROFILES.keys()
    assert str(failures(evaluate("mystery-gpu", [], {}))[0]).startswith("node: profile is mystery-gpu")


@pytest.fixture
def fleet(world):
    return small_fleet(4)


def test_a_node_failing_one_check_is_not_sold_and_staff_read_why(world, fleet, steps):
    healthy_node, broken = Node.objects.filter(pool="bare_metal", is_spare=False).order_by("hostname")[:2]
    Node.objects.filter(pk__in=[healthy_node.pk, broken.pk]).update(state="maintenance")
    SimulatedHost()._act(target_of(broken), "break", lambda s: s.update(acceptance={"5": {"pcie_width": 8}}))
    for node in (healthy_node, broken):
        validating.node_validate(actor=None, node=Node.objects.get(pk=node.pk))
    steps.run()

    assert Node.objects.get(pk=healthy_node.pk).state == "available"
    held = Node.objects.get(pk=broken.pk)
    assert held.state != "available" and "GPU 5: pcie_width is 8, must be at least x16" in held.state_reason
    assert Operation.objects.get(node=broken, kind="validate").state == "failed"
    answer = world.client("platform_approver").get(f"/api/v1/nodes/{broken.pk}/validations/")
    assert answer.status_code == 200
    run = answer.json()["results"][0]
    assert run["passed"] is False
    assert run["results"][0] == {"gpu": 5, "check": "pcie_width", "value": 8, "bound": "at least x16",
                                 "passed": False}
    assert NodeValidation.objects.get(node=healthy_node).passed


def test_the_agent_measures_simulated_gpus_and_a_broken_one_shows():
    nvml = SimulatedNVML([SimulatedGPU(index=i, uuid=f"GPU-{i}", memory_mib=81920) for i in range(2)])
    nvml.nvlink_down(1, 4)
    agent = Agent(None, nvml)

    answer = agent.execute({"id": "c1", "kind": "acceptance", "payload": {"model": H100}})

    assert answer["ok"]
    assert [g["nvlinks_up"] for g in answer["gpus"]] == [18, 17]
    failed = failures(evaluate(H100, answer["gpus"], answer["node"]))
    assert [(r.gpu, r.check) for r in failed] == [(1, "nvlinks_up")]


def test_a_real_hosts_stress_steps_are_its_commands_and_missing_ones_fail(tmp_path):
    nvml = SimulatedNVML([SimulatedGPU(index=0, uuid="GPU-0", memory_mib=81920)])
    stress = [sys.executable, "-c", "import json; print(json.dumps({'stress_tflops': 701.5, 'memtest_errors': 0}))"]
    fabric = [sys.executable, "-c", "print('warming up'); print('" + json.dumps(
        {"nccl_busbw_gbs": 395.0, "ib_bandwidth_gbps": 387.0}) + "')"]
    agent = Agent(None, nvml, stress_command=stress, fabric_test_command=fabric)

    answer = agent.acceptance(H100)

    assert answer["gpus"][0]["stress_tflops"] == 701.5 and answer["node"]["nccl_busbw_gbs"] == 395.0
    agent.stress_command = [sys.executable, "-c", "print('no json here')"]
    failed = agent.execute({"id": "c2", "kind": "acceptance", "payload": {"model": H100}})
    assert not failed["ok"] and "printed no JSON object" in failed["detail"]


def test_a_real_gpus_idle_readings_come_from_nvml(monkeypatch):
    FakeNVML(table()[:1]).install(monkeypatch)
    answers = {"nvmlDeviceGetMaxPcieLinkGeneration": 5, "nvmlDeviceGetCurrPcieLinkWidth": 16,
               "nvmlDeviceGetEccMode": [1, 1], "nvmlDeviceGetPersistenceMode": 1,
               "nvmlDeviceGetCurrentClocksEventReasons": 0x1}
    for name, value in answers.items():
        monkeypatch.setattr(pynvml, name, lambda handle, value=value: value)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetMaxClockInfo", lambda handle, clock: 1980)
    nvml = RealNVML()

    reading = agent_acceptance.readings(nvml, 0)
    nvml.shutdown()

    assert (reading["pcie_generation"], reading["pcie_width"], reading["sm_clock_max_mhz"]) == (5, 16, 1980)
    assert reading["ecc_enabled"] and reading["persistence"] and reading["nvlinks_up"] == 17
    assert reading["vbios"] == "96.00.99.00.01" and reading["driver"] == "570.124.06"
    failed = failures(evaluate(H100, [{**reading, "stress_tflops": 700.0, "memtest_errors": 0}], nominal_node(H100)))
    assert [(r.check, r.value) for r in failed] == [("nvlinks_up", 17), ("idle_temperature_c", 54),
                                                     ("idle_power_w", 412.3)]
