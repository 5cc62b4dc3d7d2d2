"""
The commands the control plane leaves for a node's agent (reset a GPU, attest, read its inventory,
apply a MIG layout...): queued for the node, handed out when its agent next calls, answered by it.
A driver that needs an agent's work queues a command here and looks for its answer on a later
look (NotYet); the node API hands them out and takes the answers (operations.node_api).
"""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone
from rest_framework.exceptions import NotFound

from cloud.models import Node
from core.errors import Conflict
from provisioning.models import AgentCommand


@transaction.atomic
def commands_take(*, node: Node) -> list[AgentCommand]:
    """The node's waiting commands (and ones sent but never answered), marked sent."""
    waiting = list(
        AgentCommand.objects.select_for_update(skip_locked=True)
        .filter(node=node, state__in=[AgentCommand.State.PENDING, AgentCommand.State.SENT])
        .order_by("created_at")[:20]
    )
    AgentCommand.objects.filter(pk__in=[c.pk for c in waiting]).update(
        state=AgentCommand.State.SENT, sent_at=timezone.now()
    )
    return waiting


def command_answer(*, node: Node, command_id, ok: bool, result: dict) -> AgentCommand:
    """The agent's answer to one of its own commands (another node's is a 404)."""
    command = AgentCommand.objects.filter(node=node, pk=command_id).first()
    if command is None:
        raise NotFound("No such command for this node.")
    if command.state != AgentCommand.State.SENT:
        raise Conflict(
            f"The command is '{command.state}': only a command sent to the agent takes an answer.",
            code="invalid_transition",
            current_state=command.state,
        )
    AgentCommand.objects.filter(pk=command.pk).update(
        state=AgentCommand.State.DONE if ok else AgentCommand.State.FAILED, result=result, done_at=timezone.now()
    )
    command.refresh_from_db()
    return command


def command_enqueue(*, node_id, kind: str, reference: str, payload: dict) -> AgentCommand:
    """Ask the node's agent for something, once per reference (a retried step finds its own command)."""
    command, _ = AgentCommand.objects.get_or_create(
        node_id=node_id, kind=kind, reference=reference, defaults={"payload": payload}
    )
    return command
