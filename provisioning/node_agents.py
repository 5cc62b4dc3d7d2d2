"""
The control plane's side of the node agents: per-node keys, the check of every signed request
(key, freshness, signature, nonce), heartbeats, and the commands an agent pulls and answers.
A node speaks only for itself: its key names the node, and a heartbeat that names a GPU of
another node is refused.
"""

from __future__ import annotations

import json
import secrets
from datetime import timedelta

from django.db import IntegrityError, connection, transaction
from django.utils import timezone
from rest_framework.exceptions import NotFound

from cloud.choices import GPUState
from cloud.errors import Conflict, DomainError, Forbidden
from cloud.models import GPU, Node
from security.audit import audit_record

from .agent.signing import HEADER_KEY, HEADER_NONCE, HEADER_SIGNATURE, HEADER_TIME, MAX_SKEW_S, valid
from .choices import InstanceState
from .models import AgentCommand, AgentNonce, AgentState, Instance, NodeCredential


class AgentAuthFailed(DomainError):
    status_code = 401
    default_code = "node_auth_failed"


class Replayed(DomainError):
    status_code = 409
    default_code = "replayed"
    default_detail = "This request was seen before (its nonce is spent); sign a new one."


@transaction.atomic
def credential_issue(*, actor, node: Node) -> tuple[NodeCredential, str]:
    """A new key for ``node``'s agent (the old one stops working); the secret is returned once."""
    secret = secrets.token_urlsafe(32)
    NodeCredential.objects.filter(node=node).delete()
    credential = NodeCredential.objects.create(node=node, key_id=f"nk_{secrets.token_hex(8)}", secret=secret)
    audit_record(actor=actor, action="node.agent_key_issue", target=node, tenant_id=None,
                 after={"key_id": credential.key_id})
    return credential, secret


def authenticate(*, method: str, path: str, headers, body: bytes, now=None) -> Node:
    """The node whose key signed this request; refuses unknown keys, stale times, bad signatures, replays."""
    now = now or timezone.now()
    key_id, timestamp, nonce, given = (headers.get(h, "") for h in (HEADER_KEY, HEADER_TIME, HEADER_NONCE,
                                                                    HEADER_SIGNATURE))
    if not (key_id and timestamp and nonce and given):
        raise AgentAuthFailed(f"Sign the request: {HEADER_KEY}, {HEADER_TIME}, {HEADER_NONCE} and "
                              f"{HEADER_SIGNATURE} are required.", code="node_auth_required")
    credential = NodeCredential.objects.select_related("node").filter(key_id=key_id, revoked_at=None).first()
    if credential is None:
        raise AgentAuthFailed("Unknown or revoked node key; issue a new one for this node.", code="node_key_invalid")
    try:
        skew = abs(now.timestamp() - int(timestamp))
    except ValueError:
        raise AgentAuthFailed(f"{HEADER_TIME} must be a Unix time in seconds.", code="stale") from None
    if skew > MAX_SKEW_S:
        raise AgentAuthFailed(f"The request's time is {int(skew)} s away from ours (at most {MAX_SKEW_S}); "
                              "check the node's clock.", code="stale")
    if len(nonce) > 64 or not valid(credential.secret, method, path, timestamp, nonce, body, given):
        raise AgentAuthFailed("The signature does not match the request.", code="signature_invalid")
    try:
        with transaction.atomic():
            AgentNonce.objects.create(node=credential.node, nonce=nonce, seen_at=now)
    except IntegrityError:
        raise Replayed() from None
    return credential.node


def heartbeat(*, node: Node, agent_version: str, gpus: list[dict], samples: list | None = None,
              ports: list | None = None, now=None) -> AgentState:
    """
    Record what the agent sees: its inventory, and its GPU samples and port states through
    ``cloud.telemetry.ingest``. An inventory that lists a GPU that is not this node's is refused
    (403), one with more GPUs than the node has too (400); then nothing is stored. Telemetry that
    ``ingest`` refuses (a sample of another node's GPU: 403; a bad reading, more samples than GPUs:
    400) is not stored, but the heartbeat's liveness (AgentState) is, and then the refusal is
    raised for the API to answer: a node whose telemetry is bad is still alive, and the watchdog
    must not fail it (and move its tenants) for that. A port GUID the node has no HCAPort for is
    skipped by ``ingest``. A fixed number of statements whatever the GPU count (every node sends
    one every MERIDIAN_AGENT_INTERVAL seconds).
    """
    from cloud import telemetry
    from cloud.detection import judge_samples

    now = now or timezone.now()
    if len(gpus) > telemetry.MAX_GPUS_PER_NODE:
        raise DomainError(f"{len(gpus)} GPUs: a node has at most {telemetry.MAX_GPUS_PER_NODE}.", code="too_many")
    stored = telemetry.node_known(node)  # the node's GPUs and ports as stored: one query, for ingest too
    known = {row[2] for row in stored.gpus}
    foreign = sorted({str(g.get("uuid")) for g in gpus} - known)
    if foreign:
        raise Forbidden(f"This node has no GPU {', '.join(foreign[:3])}; an agent speaks only for its own GPUs.",
                        code="foreign_gpu")
    if len(gpus) > len(known):
        raise DomainError(f"{len(gpus)} GPUs listed, but {node.hostname} has {len(known)}.", code="too_many")
    state = AgentState(node=node, last_seen_at=now, agent_version=agent_version[:32], gpus=gpus)
    refused = None
    with transaction.atomic():
        _agent_state_save(state)  # liveness first: kept even when the telemetry below is refused
        if samples or ports:
            try:
                # ingest returns each GPU's new sample with the one before it, and each port's link with
                # its recent flaps: failure detection judges that (no query unless something is wrong).
                ingested = telemetry.ingest(node=node, samples=samples or [], ports=ports or [], now=now,
                                            known=stored)
            except DomainError as exc:
                # ingest refuses before its one write (no savepoint needed): nothing of the telemetry
                # is stored, the liveness above commits, and the API still answers the refusal.
                refused = exc
            else:
                judge_samples(node=node, ingested=ingested, now=now)
    if refused is not None:
        raise refused
    return state


_AGENT_STATE_SQL = (
    f"INSERT INTO {AgentState._meta.db_table} (node_id, last_seen_at, agent_version, gpus) "  # noqa: S608
    "VALUES (%s, %s, %s, %s::jsonb) ON CONFLICT (node_id) DO UPDATE SET last_seen_at = EXCLUDED.last_seen_at, "
    "agent_version = EXCLUDED.agent_version, gpus = EXCLUDED.gpus"
)


def _agent_state_save(state: AgentState) -> None:
    """One upsert: a prepared statement on PostgreSQL (every node, every heartbeat), the ORM elsewhere."""
    if connection.vendor == "postgresql":
        from cloud.telemetry import fast_cursor

        with fast_cursor() as cursor:
            cursor.execute(_AGENT_STATE_SQL, [state.node_id, state.last_seen_at, state.agent_version,
                                              json.dumps(state.gpus)])
        return
    AgentState.objects.bulk_create([state], update_conflicts=True, unique_fields=["node"],
                                   update_fields=["last_seen_at", "agent_version", "gpus"])


@transaction.atomic
def commands_take(*, node: Node) -> list[AgentCommand]:
    """The node's waiting commands (and ones sent but never answered), marked sent."""
    waiting = list(AgentCommand.objects.select_for_update(skip_locked=True).filter(
        node=node, state__in=[AgentCommand.State.PENDING, AgentCommand.State.SENT]).order_by("created_at")[:20])
    AgentCommand.objects.filter(pk__in=[c.pk for c in waiting]).update(state=AgentCommand.State.SENT,
                                                                      sent_at=timezone.now())
    return waiting


def command_answer(*, node: Node, command_id, ok: bool, result: dict) -> AgentCommand:
    """The agent's answer to one of its own commands (another node's is a 404)."""
    command = AgentCommand.objects.filter(node=node, pk=command_id).first()
    if command is None:
        raise NotFound("No such command for this node.")
    if command.state != AgentCommand.State.SENT:
        raise Conflict(f"The command is '{command.state}': only a command sent to the agent takes an answer.",
                       code="invalid_transition", current_state=command.state)
    AgentCommand.objects.filter(pk=command.pk).update(
        state=AgentCommand.State.DONE if ok else AgentCommand.State.FAILED, result=result, done_at=timezone.now())
    command.refresh_from_db()
    if command.kind == "reset_gpu":
        from cloud.detection import gpu_reset_answered

        gpu_reset_answered(command=command)  # back in service after a clean sample, or escalated
    return command


def command_enqueue(*, node_id, kind: str, reference: str, payload: dict) -> AgentCommand:
    """Ask the node's agent for something, once per reference (a retried step finds its own command)."""
    command, _ = AgentCommand.objects.get_or_create(node_id=node_id, kind=kind, reference=reference,
                                                    defaults={"payload": payload})
    return command


def prune_nonces(*, older_than: timedelta = timedelta(seconds=4 * MAX_SKEW_S)) -> int:
    """Nonces older than any fresh request can be are forgotten (their request would be stale)."""
    return AgentNonce.objects.filter(seen_at__lt=timezone.now() - older_than).delete()[0]


#
# GPU isolation: the policy the agent enforces, and what it reports
#


def node_policy(*, node: Node) -> list[dict]:
    """
    Each GPU's isolation policy (security.isolation.GPUPolicy as dicts) from the live instances on
    the node: their names are the owners the host knows their processes by (a VM's domain, a
    pod); a shared GPU caps each owner at its slot's memory; a GPU nobody holds has no owner.
    """
    from cloud.choices import IsolationMode
    from security.isolation import EXCLUSIVE, MIG, SHARED

    from .steps import mig_layout_for

    owners: dict[str, dict] = {}
    modes: dict[str, str] = {}
    layouts: dict[str, str] = {}
    aliases: dict[str, dict] = {}  # GPU -> {the runtime's id of an owner: the owner}
    live = Instance.objects.filter(node=node, state__in=[InstanceState.PROVISIONING, InstanceState.ACTIVE]
                                   ).select_related("reservation__offering")
    for instance in live:
        offering = instance.reservation.offering
        for device in instance.devices:
            cap = device["mem_hi"] - device["mem_lo"] if offering.slots_per_gpu > 1 else None
            owners.setdefault(device["gpu_id"], {})[instance.name] = cap
            if instance.runtime_uid:
                aliases.setdefault(device["gpu_id"], {})[instance.runtime_uid] = instance.name
            modes[device["gpu_id"]] = {IsolationMode.MIG: MIG, IsolationMode.SHARED: SHARED}.get(
                offering.isolation_mode, EXCLUSIVE)
            if offering.isolation_mode == IsolationMode.MIG and instance.state == InstanceState.ACTIVE:
                # Enforced once handed over: until then provisioning is still cutting the GPU.
                layouts[device["gpu_id"]] = mig_layout_for(offering)
    return [{"index": index, "mode": modes.get(str(gpu_id), EXCLUSIVE), "owners": owners.get(str(gpu_id), {}),
             "mig_layout": layouts.get(str(gpu_id)), "aliases": aliases.get(str(gpu_id), {})}
            for gpu_id, index in node.gpus.order_by("index").values_list("pk", "index")]


@transaction.atomic
def violations_report(*, node: Node, violations: list[dict]) -> int:
    """
    What the agent's watchdog found and did: each violation is an incident (for the tenants whose
    GPU it was) and an audit event; a GPU whose MIG layout is wrong is quarantined, and the work
    on it is replaced (provisioning.replacement.gpus_failed).
    """
    from security.models import Incident

    gpus = {gpu.index: gpu for gpu in node.gpus.all()}
    live = list(Instance.objects.filter(node=node, state__in=[InstanceState.PROVISIONING, InstanceState.ACTIVE]
                                        ).only("tenant_id", "devices"))
    held: dict = {}  # GPUs quarantined now under tenants' work: id -> what was found
    for violation in violations:
        gpu = gpus.get(int(violation["index"]))
        if gpu is None:
            raise Forbidden(f"This node has no GPU {violation['index']}.", code="foreign_gpu")
        # Matched here, not by a JSON lookup: SQLite (the embedded default) has no JSON containment.
        tenants = sorted({str(i.tenant_id) for i in live if any(d["gpu_id"] == str(gpu.pk) for d in i.devices)})
        summary = f"{node.hostname} GPU {gpu.index}: {violation['kind']} -- {violation['detail']}"[:500]
        Incident.objects.create(kind=f"isolation_{violation['kind']}", node_id=node.pk, summary=summary,
                                tenant_id=tenants[0] if len(tenants) == 1 else None,
                                evidence={"gpu": gpu.uuid, **{k: violation.get(k) for k in
                                                              ("kind", "action", "detail", "owner", "pids")}})
        audit_record(actor=None, action="isolation.violation", target=node, tenant_id=None,
                     after={"gpu": gpu.index, "kind": violation["kind"], "action": violation["action"]})
        if violation["action"] == "quarantine_gpu" and gpu.state != GPUState.QUARANTINED:
            GPU.objects.filter(pk=gpu.pk).update(state=GPUState.QUARANTINED)
            if tenants:
                held[gpu.pk] = summary
    if held:
        # Tenants' work on a GPU held for isolation moves to sound GPUs (the GPU is used again
        # only after the node's validation): provisioning.replacement, as for a failed GPU.
        from .replacement import gpus_failed

        now = timezone.now()
        gpus_failed(node=node, gpu_ids=list(held), cause="isolation", summary="; ".join(held.values())[:500],
                    evidence={"violations": len(violations)}, impact_started_at=now, detected_at=now)
    return len(violations)
