"""
GPU memory isolation, enforced out of band: the pure judgement (security.isolation), and the
node agent's watchdog with a simulated NVML against the policy the control plane computes from
the allocations -- each violation acted on within one watchdog turn and reported as an incident,
compliant processes untouched, two tenants sharing a GPU each held to their own slot.
"""

from __future__ import annotations

import pytest

from cloud.models import GPU, Node
from operations.node_api import agents as node_agents
from provisioning.agent.agent import Agent, simulated_host
from provisioning.agent.attester import SimulatedAttester
from provisioning.agent.nvml import SimulatedGPU, SimulatedNVML
from provisioning.drivers.simulated_devices import attester_identities
from provisioning.models import Instance, Reservation
from security.isolation import (
    KILL_PROCESS,
    MIG,
    QUARANTINE_GPU,
    SHARED,
    STOP_CONTAINER,
    GPUPolicy,
    Process,
    evaluate,
)
from security.models import Incident
from tests.provisioning.factories import offering
from tests.provisioning.pipeline import SSH_KEY
from tests.world import small_fleet, vm_offering

#
# The judgement
#


def test_an_exclusive_gpu_allows_its_owner_and_kills_anyone_else():
    policy = GPUPolicy(index=0, owners={"vm-a": None})
    assert evaluate(policy, [Process(10, "vm-a", 70_000)]) == []
    found = evaluate(policy, [Process(10, "vm-a", 70_000), Process(11, "vm-b", 1_000), Process(12, None, 10)])
    assert [(v.kind, v.action, v.pids) for v in found] == [("foreign_process", KILL_PROCESS, (11,)),
                                                            ("foreign_process", KILL_PROCESS, (12,))]


def test_an_idle_gpu_has_no_owner_so_any_process_is_foreign():
    assert [v.pids for v in evaluate(GPUPolicy(index=3), [Process(7, "vm-old", 5)])] == [(7,)]


def test_shared_gpus_hold_each_owner_to_its_cap_alone():
    policy = GPUPolicy(index=1, mode=SHARED, owners={"ct-a": 10_240, "ct-b": 10_240})
    within = [Process(1, "ct-a", 6_000), Process(2, "ct-a", 4_000), Process(3, "ct-b", 10_240)]
    assert evaluate(policy, within) == []
    over = evaluate(policy, [*within, Process(4, "ct-b", 1)])
    assert [(v.kind, v.owner, v.action, v.pids) for v in over] == [("over_cap", "ct-b", STOP_CONTAINER, (3, 4))]


def test_a_mig_gpu_in_the_wrong_layout_is_quarantined():
    policy = GPUPolicy(index=2, mode=MIG, owners={"ct-a": 10_240}, mig_layout="mig")
    assert evaluate(policy, [], mig_layout="mig") == []
    assert [(v.kind, v.action) for v in evaluate(policy, [], mig_layout=None)] == [("wrong_mig_layout",
                                                                                    QUARANTINE_GPU)]
    # Being cut for a new owner (no layout enforced yet): whatever it is in now is not a violation.
    cutting = GPUPolicy(index=2, mode=MIG, owners={"ct-a": 10_240}, mig_layout=None)
    assert evaluate(cutting, [], mig_layout="7-way") == [] and evaluate(cutting, [], mig_layout=None) == []


#
# The watchdog on a node, through the node agent and the control plane
#


@pytest.fixture
def fleet(world):
    Reservation.objects.all().delete()
    return small_fleet(4)


class InProcess:
    """The node API in process, for an agent turn without HTTP (the signed HTTP path has its own tests)."""

    def __init__(self, node):
        self.node = node

    def call(self, method, path, payload=None):
        if path == "/heartbeat/":
            node_agents.heartbeat(node=self.node, agent_version="1", gpus=payload["gpus"])
            return {"ok": True, "policy": node_agents.node_policy(node=self.node)}
        if path == "/violations/":
            return {"recorded": node_agents.violations_report(node=self.node, violations=payload["violations"])}
        if path == "/commands/":
            return {"commands": []}
        raise AssertionError(path)


def agent_for(node) -> Agent:
    nvml = SimulatedNVML([SimulatedGPU(index=g.index, uuid=g.uuid, memory_mib=g.memory_mib)
                          for g in node.gpus.order_by("index")])
    owner, kill = simulated_host(nvml)
    return Agent(InProcess(node), nvml, attester=SimulatedAttester(attester_identities(node)),
                 hostname=node.hostname, process_owner=owner, kill=kill)


def vm_on_the_host(world, steps, persona="t1_member") -> Instance:
    response = world.client(persona).post("/api/v1/reservations/", {
        "name": "vm", "offering": vm_offering(1).slug, "gpus": 1, "regions": ["us-east-1"], "duration_hours": 1,
        "ssh_public_key": SSH_KEY}, format="json")
    steps.run()
    return Instance.objects.get(reservation_id=response.json()["id"], state="active")


def test_a_foreign_process_on_a_tenants_gpu_is_killed_within_one_turn_and_reported(world, fleet, steps):
    mine = vm_on_the_host(world, steps)
    host = mine.node
    agent = agent_for(host)
    index = mine.devices[0]["index"]
    gpu = agent.nvml.gpus[index]
    gpu.processes = [{"pid": 100, "used_memory_mib": 60_000, "owner": mine.name},
                     {"pid": 666, "used_memory_mib": 2_000, "owner": "r000000000000-0"}]  # someone else's
    agent.run_once()
    assert [p["pid"] for p in gpu.processes] == [100]  # the owner's untouched, the intruder gone
    incident = Incident.objects.get(kind="isolation_foreign_process", node_id=host.pk)
    assert incident.tenant_id == world.t1.tenant.pk and incident.evidence["pids"] == [666]
    agent.run_once()
    assert Incident.objects.filter(kind__startswith="isolation_").count() == 1  # nothing new to find


def test_a_process_on_a_gpu_nobody_holds_is_killed(world, fleet):
    host = Node.objects.get(pool="shared", is_spare=False)
    agent = agent_for(host)
    agent.nvml.gpus[5].processes = [{"pid": 42, "used_memory_mib": 100, "owner": None}]
    agent.run_once()
    assert agent.nvml.gpus[5].processes == []
    assert Incident.objects.get(kind="isolation_foreign_process").tenant_id is None


def test_two_tenants_sharing_a_gpu_are_each_held_to_their_own_slot(world, fleet, steps):
    shared = offering("container", 1, slots_per_gpu=4, isolation_mode="shared")
    made = []
    for persona in ("t1_member", "t2_member"):
        response = world.client(persona).post("/api/v1/reservations/", {
            "name": "ct", "offering": shared.slug, "slots": 1, "regions": ["us-east-1"], "duration_hours": 1,
            "ssh_public_key": SSH_KEY}, format="json")
        assert response.status_code == 201, response.json()
        made.append(response.json()["id"])
    steps.run()
    a, b = (Instance.objects.get(reservation_id=pk, state="active") for pk in made)
    assert a.devices[0]["gpu_id"] == b.devices[0]["gpu_id"]  # bin-packed onto one GPU
    cap = a.devices[0]["mem_hi"] - a.devices[0]["mem_lo"]
    agent = agent_for(a.node)
    gpu = agent.nvml.gpus[a.devices[0]["index"]]
    gpu.processes = [{"pid": 1, "used_memory_mib": cap - 10, "owner": a.name},
                     {"pid": 2, "used_memory_mib": cap + 500, "owner": b.name}]
    agent.run_once()
    assert [p["pid"] for p in gpu.processes] == [1]  # a stays; b, over its slot, is stopped
    incident = Incident.objects.get(kind="isolation_over_cap")
    assert incident.evidence["owner"] == b.name and str(cap) in incident.evidence["detail"]


def test_a_wrong_mig_layout_quarantines_the_gpu(world, fleet, steps):
    mig = offering("container", 1, slots_per_gpu=7, isolation_mode="mig")
    response = world.client("t1_member").post("/api/v1/reservations/", {
        "name": "ct", "offering": mig.slug, "slots": 1, "regions": ["us-east-1"], "duration_hours": 1,
        "ssh_public_key": SSH_KEY}, format="json")
    steps.run()
    instance = Instance.objects.get(reservation_id=response.json()["id"], state="active")
    index = instance.devices[0]["index"]
    steps_run = [s.name for s in instance.reservation.operations.get(kind="provision").steps.order_by("pk")]
    assert steps_run[0] == "configure_mig"  # cut before the hand-over
    # While it is being provisioned the layout is not enforced yet (provisioning is still cutting the GPU).
    Instance.objects.filter(pk=instance.pk).update(state="provisioning")
    assert node_agents.node_policy(node=instance.node)[index]["mig_layout"] is None
    Instance.objects.filter(pk=instance.pk).update(state="active")
    assert node_agents.node_policy(node=instance.node)[index]["mig_layout"] == "7-way"
    agent = agent_for(instance.node)
    assert agent.set_mig_layout(index, "7-way") == ""  # the layout it was handed over in
    agent.run_once()
    assert GPU.objects.get(pk=instance.devices[0]["gpu_id"]).state != "quarantined"  # in its layout: fine
    agent.nvml.gpus[index].mig = (False, False)  # MIG turned off under the tenant: not what was handed over
    agent.run_once()
    assert GPU.objects.get(pk=instance.devices[0]["gpu_id"]).state == "quarantined"
    assert Incident.objects.filter(kind="isolation_wrong_mig_layout").exists()


#
# Scrubbing between tenants, verified
#


def scrub(agent, index):
    return agent.execute({"id": "c1", "kind": "scrub", "payload": {"devices": [
        {"index": index, "mem_lo": 0, "mem_hi": 81920}]}})


def test_a_scrub_is_verified_no_process_and_memory_back_to_baseline(world, fleet):
    host = Node.objects.get(pool="shared", is_spare=False)
    agent = agent_for(host)
    agent.nvml.gpus[0].used = {(0, 81920)}
    assert scrub(agent, 0) == {"ok": True, "detail": ""}
    agent.nvml.gpus[1].processes = [{"pid": 5, "used_memory_mib": 4096, "owner": "r000000000000-0"}]
    failed = scrub(agent, 1)
    assert not failed["ok"] and "process(es) still running" in failed["detail"]


def test_a_real_hosts_scrub_runs_its_configured_reset_command(world, fleet, tmp_path):
    import sys

    host = Node.objects.get(pool="shared", is_spare=False)
    agent = agent_for(host)
    marker = tmp_path / "reset"
    agent.scrub_command = [sys.executable, "-c", f"open({str(marker)!r} + '{{index}}', 'w').write('done')"]
    assert scrub(agent, 3)["ok"] and (tmp_path / "reset3").read_text() == "done"
    agent.scrub_command = [sys.executable, "-c", "import sys; sys.stderr.write('reset refused'); sys.exit(3)"]
    failed = scrub(agent, 3)
    assert not failed["ok"] and "reset refused" in failed["detail"]


def test_the_host_names_a_processs_owner_from_its_cgroup():
    from provisioning.agent.agent import owner_from_cgroup

    vm = "0::/machine.slice/machine-qemu\\x2d4\\x2dr0123456789ab\\x2d0.scope/libvirt/vcpu0\n"
    assert owner_from_cgroup(vm) == "r0123456789ab-0"
    pod = ("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
           "1f2e3d4c_5b6a_4789_9abc_def012345678.slice/cri-containerd-0a1b.scope\n")
    assert owner_from_cgroup(pod) == "1f2e3d4c-5b6a-4789-9abc-def012345678"
    assert owner_from_cgroup("0::/user.slice/user-1000.slice/session-2.scope\n") is None


def test_a_containers_processes_are_known_by_its_pods_uid(world, fleet, steps):
    shared = offering("container", 1, slots_per_gpu=4, isolation_mode="shared")
    response = world.client("t1_member").post("/api/v1/reservations/", {
        "name": "ct", "offering": shared.slug, "slots": 1, "regions": ["us-east-1"], "duration_hours": 1,
        "ssh_public_key": SSH_KEY}, format="json")
    steps.run()
    instance = Instance.objects.get(reservation_id=response.json()["id"], state="active")
    assert instance.runtime_uid  # the pod's UID, as the API server gave it
    agent = agent_for(instance.node)
    gpu = agent.nvml.gpus[instance.devices[0]["index"]]
    gpu.processes = [{"pid": 1, "used_memory_mib": 100, "owner": instance.runtime_uid},  # as its cgroup names it
                     {"pid": 2, "used_memory_mib": 100, "owner": "00000000-0000-4000-8000-000000000000"}]
    agent.run_once()
    assert [p["pid"] for p in gpu.processes] == [1]
