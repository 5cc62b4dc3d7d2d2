"""
Scrubbing one tenant's slot of a GPU other tenants still use: the GPU is never reset under them,
only the slot's range is cleared, and "is it clean" is the slot's own accounting (its owner's
processes and their memory), not the whole GPU's, which counts the neighbours' work. The
simulated NVML holds several tenants' memory and processes so the tests can see both.
"""

from __future__ import annotations

import sys

import pytest

from cloud.models import Node
from provisioning.lifecycle.steps import scrub_devices
from provisioning.models import AgentCommand, Instance
from tests.provisioning.factories import offering
from tests.provisioning.pipeline import SSH_KEY
from tests.security.test_isolation import agent_for
from tests.world import small_fleet

HALF = 40960


@pytest.fixture
def fleet(world):
    return small_fleet(4)


@pytest.fixture
def shared_gpu(world, fleet, tmp_path):
    """GPU 0 of a shared host holding two tenants: vm-a in MiB 0-40960, vm-b in 40960-81920."""
    agent = agent_for(Node.objects.filter(pool="shared", is_spare=False).order_by("hostname").first())
    gpu = agent.nvml.gpus[0]
    gpu.used = {(0, HALF), (HALF, 2 * HALF)}
    gpu.processes = [{"pid": 11, "used_memory_mib": 30000, "owner": "vm-a"},
                     {"pid": 22, "used_memory_mib": 20000, "owner": "vm-b"}]
    reset_marker = tmp_path / "reset"
    agent.scrub_command = [sys.executable, "-c", f"open({str(reset_marker)!r}, 'w').write('reset')"]
    return agent, gpu, reset_marker


class RealLike:
    """The simulated readings without the simulated memory: as RealNVML, nothing to clear a range with."""

    def __init__(self, nvml):
        self._nvml = nvml

    def __getattr__(self, name):
        if name == "gpus":
            raise AttributeError(name)
        return getattr(self._nvml, name)


def slot(owner="vm-a", neighbours=1, lo=0, hi=HALF):
    return {"index": 0, "mem_lo": lo, "mem_hi": hi, "owner": owner, "aliases": {}, "neighbours": neighbours}


def scrub(agent, device):
    return agent.execute({"id": "c1", "kind": "scrub", "payload": {"devices": [device]}})


def test_a_slot_scrub_leaves_the_neighbours_memory_and_processes_alone(shared_gpu):
    agent, gpu, reset_marker = shared_gpu

    answer = scrub(agent, slot())

    assert answer == {"ok": True, "detail": ""}
    assert gpu.processes == [{"pid": 22, "used_memory_mib": 20000, "owner": "vm-b"}]
    assert gpu.used == {(HALF, 2 * HALF)}
    assert not reset_marker.exists()  # the GPU was not reset under vm-b
    # The whole GPU still holds vm-b's 20000 MiB, far above the baseline: the slot is judged by its own accounting.
    assert agent.nvml.memory(0)["used_mib"] == 20000 > agent.baseline_mib


def test_a_slot_whose_owner_survives_the_kill_is_not_clean(shared_gpu):
    agent, gpu, _ = shared_gpu
    agent.kill = lambda index, pid: None  # the process will not die

    answer = scrub(agent, slot())

    assert not answer["ok"]
    assert "1 process(es) of vm-a still hold 30000 MiB" in answer["detail"]


def test_a_slot_range_that_still_holds_data_is_not_clean(shared_gpu):
    agent, gpu, _ = shared_gpu
    agent.nvml.scrub = lambda index, lo, hi: False  # the range could not be cleared

    answer = scrub(agent, slot())

    assert not answer["ok"] and "MiB 0-40960 still hold data" in answer["detail"]


def test_a_real_shared_host_clears_the_slot_with_its_command_never_the_reset(shared_gpu, tmp_path):
    agent, gpu, reset_marker = shared_gpu
    ranges = tmp_path / "ranges"
    agent.slot_scrub_command = [sys.executable, "-c",
                                f"open({str(ranges)!r}, 'a').write('{{index}} {{mem_lo}} {{mem_hi}}')"]

    assert scrub(agent, slot())["ok"]
    assert ranges.read_text() == "0 0 40960" and not reset_marker.exists()


def test_a_real_shared_host_without_a_slot_command_says_so_instead_of_resetting(shared_gpu):
    agent, _, reset_marker = shared_gpu
    agent.nvml = RealLike(agent.nvml)

    answer = scrub(agent, slot())

    assert not answer["ok"] and "no --slot-scrub-command" in answer["detail"]
    assert not reset_marker.exists()


def test_the_last_tenant_of_a_gpu_gets_the_full_reset(shared_gpu):
    agent, gpu, reset_marker = shared_gpu
    gpu.processes = [p for p in gpu.processes if p["owner"] == "vm-a"]

    agent.kill(0, 11)
    assert scrub(agent, slot(neighbours=0))["ok"]
    assert reset_marker.read_text() == "reset"


def test_the_control_plane_tells_the_agent_who_else_holds_the_gpu(world, fleet, steps):
    shared = offering("container", 1, slots_per_gpu=4, isolation_mode="shared")
    made = []
    for persona in ("t1_member", "t2_member"):
        response = world.client(persona).post("/api/v1/reservations/", {
            "name": "ct", "offering": shared.slug, "slots": 1, "regions": ["us-east-1"], "duration_hours": 1,
            "ssh_public_key": SSH_KEY}, format="json")
        assert response.status_code == 201, response.json()
        made.append(response.json()["id"])
    steps.run()
    first, second = (Instance.objects.get(reservation_id=pk, state="active") for pk in made)
    same_gpu = first.devices[0]["gpu_id"] == second.devices[0]["gpu_id"]

    devices = scrub_devices([first, second])[first.pk]

    assert devices[0]["owner"] == first.name
    assert devices[0]["aliases"] == ({first.runtime_uid: first.name} if first.runtime_uid else {})
    assert devices[0]["neighbours"] == (1 if same_gpu else 0)
    assert same_gpu, "two one-slot containers are packed on one GPU"
    assert not AgentCommand.objects.exists()
