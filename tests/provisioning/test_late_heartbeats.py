"""
A loaded control plane hears its node agents late. A late agent is not a failed node: the step
that needs the agent waits for it (the heartbeat watchdog, not a step's patience, decides whether
a node failed), and the waits of a step over many nodes are counted per node -- a 14-node
bare-metal reservation's verify once ran out of a budget meant for one node, had a healthy node
marked faulty and was placed again on other nodes, its start slipping.
"""

from datetime import timedelta

import pytest
import time_machine
from django.utils import timezone

from cloud.models import Node
from operations.node_api import agents as node_agents
from provisioning.agent.agent import Agent
from provisioning.agent.attester import SimulatedAttester
from provisioning.agent.nvml import SimulatedGPU, SimulatedNVML
from provisioning.agents import commands as agent_commands
from provisioning.drivers.simulated_devices import attester_identities
from provisioning.models import AgentCommand, Instance, Operation, Reservation, StepRun
from tests.provisioning.factories import offering
from tests.provisioning.pipeline import SSH_KEY, reservation
from tests.world import small_fleet

pytestmark = pytest.mark.django_db


@pytest.fixture
def fleet(world, settings):
    settings.MERIDIAN_DRIVERS = {"default": {"host": "agent"}}
    settings.MERIDIAN_AGENT_INTERVAL = 10.0
    Reservation.objects.all().delete()
    return small_fleet(8)


def agent_turn(node: Node) -> None:
    """One turn of the node's agent: a heartbeat, then an answer to every command it pulls."""
    nvml = SimulatedNVML([SimulatedGPU(index=i, uuid=u, memory_mib=m) for i, u, m in
                          node.gpus.order_by("index").values_list("index", "uuid", "memory_mib")])
    agent = Agent(None, nvml, attester=SimulatedAttester(attester_identities(node)), hostname=node.hostname)
    node_agents.heartbeat(node=node, agent_version="1", gpus=nvml.inventory())
    for command in agent_commands.commands_take(node=node):
        result = agent.execute({"id": command.pk, "kind": command.kind, "payload": command.payload})
        node_agents.command_answered(node=node, command_id=command.pk, ok=result["ok"], result=result)


def bare_metal(world, nodes: int) -> str:
    response = world.client("t1_member").post("/api/v1/reservations/", {
        "name": "big", "offering": offering("bare_metal", 8).slug, "nodes": nodes, "regions": ["us-east-1"],
        "duration_hours": 2, "ssh_public_key": SSH_KEY}, format="json")
    assert response.status_code == 201 and response.json()["state"] == "scheduled", response.json()
    return response.json()["id"]


def nodes_of(pk) -> set:
    return set(Instance.objects.filter(reservation_id=pk).values_list("node__hostname", flat=True))


def test_an_agent_heard_late_is_waited_for_and_its_node_is_not_failed(world, fleet, steps):
    pk = bare_metal(world, 1)
    start = timezone.now()
    with time_machine.travel(start, tick=False) as clock:
        steps.run(limit=4, settle=False)  # started; the BMC steps need no agent
        node = Instance.objects.get(reservation_id=pk).node
        agent_turn(node)
        # The machine is loaded: the agent's next turn comes 45 s later (its period is 10 s). Every
        # step that asks for it meanwhile finds it unheard for more than three periods.
        clock.shift(timedelta(seconds=45))
        steps.run(limit=12, settle=False)
        assert Node.objects.get(pk=node.pk).state == "allocated"
        assert reservation(pk).state == "provisioning" and nodes_of(pk) == {node.hostname}
        operation = Operation.objects.get(reservation_id=pk, kind="provision")
        assert (operation.state, operation.step) == ("running", "verify")
        waiting = StepRun.objects.filter(operation=operation, name="verify", state="waiting")
        assert waiting.exists() and "has not been heard" in waiting.last().error
        agent_turn(node)  # late, but there
        steps.run(limit=3, settle=False)
        agent_turn(node)  # the attestation challenge answered
        steps.run()
    assert reservation(pk).state == "active" and nodes_of(pk) == {node.hostname}
    assert reservation(pk).provision_failures == 0 and Node.objects.get(pk=node.pk).state == "allocated"


def test_the_waits_of_a_step_over_many_nodes_are_counted_per_node(world, fleet, steps, settings):
    """Each node answers on its agent's turn, three looks apart: four nodes wait twelve times, three each."""
    settings.MERIDIAN_STEP_WAITS = 4
    pk = bare_metal(world, 4)
    nodes = list(Node.objects.filter(allocations__reservation_id=pk).distinct())
    assert len(nodes) == 4
    for node in nodes:
        agent_turn(node)
    for _ in range(40):
        if not steps.queue:
            break
        steps.run(limit=3, settle=False)  # three looks at the pending answer...
        for node in nodes:
            agent_turn(node)  # ...then the agents' turn
    steps.run()
    assert reservation(pk).state == "active", StepRun.objects.filter(state__in=["failed", "gave_up"]).values_list(
        "error", flat=True)
    assert nodes_of(pk) == {node.hostname for node in nodes} and not Node.objects.filter(state="faulty").exists()
    waits = StepRun.objects.filter(operation__reservation_id=pk, name="verify", state="waiting")
    assert waits.count() > settings.MERIDIAN_STEP_WAITS  # more than one node's budget, none over its own
    # Each node was challenged once: a node attested on an earlier look is not asked again.
    assert AgentCommand.objects.filter(kind="attest").count() == AgentCommand.objects.filter(
        kind="attest", state="done").count() == 4
