"""
The control plane's side of the node agents: per-node keys, the check of every signed request
(key, freshness, signature, nonce), heartbeats, and the commands an agent pulls and answers.
A node speaks only for itself: its key names the node, and a heartbeat that names a GPU of
another node is refused.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from datetime import timedelta
from typing import NamedTuple

from django.db import DEFAULT_DB_ALIAS, IntegrityError, connection, transaction
from django.utils import timezone

from cloud import telemetry
from cloud.choices import TIME_SLICE_MEMORY_SHARE, TIME_SLICE_MS, GPUState, IsolationMode
from cloud.models import GPU, Node, Offering
from cloud.telemetry import NODE_KNOWN_COLUMNS, Checked, known_from_columns, write_params, write_sql
from core.db import fast_cursor
from core.errors import DomainError, Forbidden
from operations.detection import gpu_reset_answered, judge_samples
from provisioning.agent.signing import HEADER_KEY, HEADER_NONCE, HEADER_SIGNATURE, HEADER_TIME, MAX_SKEW_S, valid
from provisioning.agents.commands import command_answer
from provisioning.choices import InstanceState
from provisioning.lifecycle.replacement import gpus_failed
from provisioning.lifecycle.steps import mig_layout_for
from provisioning.models import AgentCommand, AgentNonce, AgentState, Instance, NodeCredential, Reservation
from security.audit import audit_record
from security.crypto import decrypt
from security.isolation import EXCLUSIVE, MIG, SHARED
from security.models import Incident


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
    audit_record(
        actor=actor, action="node.agent_key_issue", target=node, tenant_id=None, after={"key_id": credential.key_id}
    )
    return credential, secret


class TurnRead(NamedTuple):
    """What an agent's heartbeat reads of its node: its stored GPUs and ports, its desired state."""
    known: object  # cloud.telemetry.Known
    desired: tuple  # _desired's
    # The request's nonce, not spent yet: agent_turn spends it in the statement that stores the
    # liveness, its first write (set by authenticate, only for a request it has verified).
    nonce: str | None = None


def authenticate(
    *, method: str, path: str, headers, body: bytes, now=None, turn: bool = False, spend: bool = True
) -> tuple[Node, TurnRead | None]:
    """
    The node whose key signed this request; refuses unknown keys, stale times, bad signatures,
    replays. Two statements whatever the request: the key with its node, then the nonce spent.
    With ``turn`` (a heartbeat) the first also reads what ``agent_turn`` needs (on PostgreSQL; None
    elsewhere). That read comes before the signature is checked (a stale or malformed time is
    refused before any read): a forged request with a live key costs one read of that node's rows,
    and writes nothing. A heartbeat's nonce is then left in the read, unspent: ``agent_turn``
    spends it in its first write (the liveness), or refuses the heartbeat as a replay -- one
    statement instead of two, and nothing of a replay is stored either way. ``spend=False`` leaves
    the nonce to the caller, whose write refuses a replay itself (a liveness ping's sequence).
    """
    now = now or timezone.now()
    key_id, timestamp, nonce, given = (
        headers.get(h, "") for h in (HEADER_KEY, HEADER_TIME, HEADER_NONCE, HEADER_SIGNATURE)
    )
    if not (key_id and timestamp and nonce and given):
        raise AgentAuthFailed(
            f"Sign the request: {HEADER_KEY}, {HEADER_TIME}, {HEADER_NONCE} and {HEADER_SIGNATURE} are required.",
            code="node_auth_required",
        )
    try:
        skew = abs(now.timestamp() - int(timestamp))
    except ValueError:
        raise AgentAuthFailed(f"{HEADER_TIME} must be a Unix time in seconds.", code="stale") from None
    if skew > MAX_SKEW_S:
        raise AgentAuthFailed(
            f"The request's time is {int(skew)} s away from ours (at most {MAX_SKEW_S}); check the node's clock.",
            code="stale",
        )
    found = _credential(key_id, turn)
    if found is None:
        raise AgentAuthFailed("Unknown or revoked node key; issue a new one for this node.", code="node_key_invalid")
    secret, node, read = found
    if len(nonce) > 64 or not valid(secret, method, path, timestamp, nonce, body, given):
        raise AgentAuthFailed("The signature does not match the request.", code="signature_invalid")
    if read is not None:
        return node, read._replace(nonce=nonce)  # verified: agent_turn spends it with the liveness
    if not spend:
        return node, None
    if not _nonce_spend(node=node, nonce=nonce, now=now):
        raise Replayed()
    return node, read


# The node's own columns but those the database gives back converted (the BMC password, encrypted:
# an agent's request has no use for it); a field left out loads when read, as ``defer()`` does.
_NODE_FIELDS = [f for f in Node._meta.concrete_fields if not hasattr(f, "from_db_value")]
_NODE_ATTNAMES = [f.attname for f in _NODE_FIELDS]
_CREDENTIAL_SELECT = f"SELECT k.secret, {', '.join(f'n.{f.column}' for f in _NODE_FIELDS)}"
_CREDENTIAL_FROM = (
    f" FROM {NodeCredential._meta.db_table} k JOIN {Node._meta.db_table} n ON n.id = k.node_id "  # noqa: S608
    "WHERE k.key_id = %(key)s AND k.revoked_at IS NULL"
)
_CREDENTIAL_SQL = _CREDENTIAL_SELECT + _CREDENTIAL_FROM
_NONCE_SQL = (
    f"INSERT INTO {AgentNonce._meta.db_table} (node_id, nonce, seen_at) VALUES (%s, %s, %s) "  # noqa: S608
    "ON CONFLICT (node_id, nonce) DO NOTHING"
)


def _own_transaction(write: str) -> str:
    """
    ``write`` (one INSERT) as a statement that commits without waiting for the WAL flush when it
    is its own transaction, and says whether it wrote its row.
    """
    return (
        f"WITH done AS ({write} RETURNING 1) "  # noqa: S608 -- our own statements
        "SELECT set_config('synchronous_commit', 'off', true), EXISTS (SELECT FROM done)"
    )


def _write(sql: str, params: list) -> bool:
    """
    Run one prepared write of the hot path (``sql`` an INSERT); True when it wrote its row. Run in
    autocommit it is its own transaction, committed without waiting for the WAL flush; inside a
    caller's transaction it leaves that transaction's durability alone (a plain statement).
    """
    with fast_cursor() as cursor:
        if connection.in_atomic_block:
            cursor.execute(sql, params)
            return cursor.rowcount == 1
        cursor.execute(_OWN[sql], params)
        return cursor.fetchone()[1]


def _credential(key_id: str, turn: bool = False) -> tuple[str, Node, TurnRead | None] | None:
    """
    The live key's secret and its node, in one statement (prepared on PostgreSQL: every agent
    request asks it), or None for an unknown or revoked key; with ``turn``, on PostgreSQL, the
    same statement reads the node's ``TurnRead`` too.
    """
    if connection.vendor != "postgresql":
        credential = NodeCredential.objects.select_related("node").filter(key_id=key_id, revoked_at=None).first()
        return None if credential is None else (credential.secret, credential.node, None)

    with fast_cursor() as cursor:
        cursor.execute(_CREDENTIAL_TURN_SQL if turn else _CREDENTIAL_SQL, {"key": key_id})
        row = cursor.fetchone()
    if row is None:
        return None
    columns = 1 + len(_NODE_FIELDS)
    node = Node.from_db(DEFAULT_DB_ALIAS, _NODE_ATTNAMES, row[1:columns])
    read = _turn_read(*row[columns:]) if turn else None
    return decrypt(row[0]), node, read


def _nonce_spend(*, node: Node, nonce: str, now) -> bool:
    """
    Record ``nonce`` as spent by ``node``; False when it was spent before (a replay). The nonces
    live in the database (AgentNonce, unique per node), not in the cache: a cache may evict or lose
    a key (Redis under memory pressure or restarted; the embedded file cache culls past 300
    entries and its add() is not atomic across processes), and a replay would then pass. On
    PostgreSQL it is one prepared insert that does nothing on a spent nonce: a second copy arriving
    at the same moment waits for the first's row, then is refused.

    It commits without waiting for the WAL flush (``_write``), and that refuses every replay that
    matters: the row is visible to every other session as soon as it commits, and the request's
    own writes commit after it in the WAL, so a crash that loses the nonce lost all of them too --
    a request replayed then only does again what was lost, as the agent's retry would.
    """
    if connection.vendor != "postgresql":
        try:
            with transaction.atomic():
                AgentNonce.objects.create(node=node, nonce=nonce, seen_at=now)
        except IntegrityError:
            return False
        return True
    return _write(_NONCE_SQL, [node.pk, nonce, now])


def agent_turn(
    *,
    node: Node,
    agent_version: str,
    gpus: list[dict],
    samples: list | None = None,
    ports: list | None = None,
    held: str | None = None,
    read: TurnRead | None = None,
    now=None,
) -> dict:
    """
    An agent's heartbeat and the answer it gets (``heartbeat_answer``). ``read`` is what
    ``authenticate(turn=True)`` read of the node with its key -- what is stored of it (for
    ``heartbeat``'s checks) and its desired state (for the answer) -- or None to read them here --
    with the request's nonce when it is still to be spent (``heartbeat`` spends it with the
    liveness). The desired state is read again when failure detection acted on the heartbeat.
    """
    known, desired, nonce = read or (None, None, None)
    heard = heartbeat(node=node, agent_version=agent_version, gpus=gpus, samples=samples, ports=ports, now=now,
                      known=known, nonce=nonce)
    # Failure detection acted on this heartbeat (a GPU reset enqueued, GPUs or the node failed and
    # their instances ended): the desired state read before is not the truth any more.
    return heartbeat_answer(node=node, held=held, desired=None if heard.acted else desired)


def heartbeat(
    *,
    node: Node,
    agent_version: str,
    gpus: list[dict],
    samples: list | None = None,
    ports: list | None = None,
    now=None,
    known=None,
    nonce: str | None = None,
) -> Heard:
    """
    Record what the agent sees: its inventory, and its GPU samples and port states through
    ``cloud.telemetry.ingest``. An inventory that lists a GPU that is not this node's is refused
    (403), one with more GPUs than the node has too (400); then nothing is stored. Telemetry that
    ``ingest`` refuses (a sample of another node's GPU: 403; a bad reading, more samples than GPUs:
    400) is not stored, but the heartbeat's liveness (AgentState) is, and then the refusal is
    raised for the API to answer: a node whose telemetry is bad is still alive, and the watchdog
    must not fail it (and move its tenants) for that. A port GUID the node has no HCAPort for is
    skipped by ``ingest``. A fixed number of statements whatever the GPU count (every node sends
    one every MERIDIAN_AGENT_INTERVAL seconds), and no transaction of their own: on PostgreSQL the
    read (none when ``known`` is given), then the liveness and the telemetry -- one write with
    ``nonce``, two without -- each atomic by itself and committed as it runs, so failure detection
    acts on samples already stored (in its own transaction, only when it found something).
    ``known`` is ``telemetry.node_known(node)`` when the caller read it already. ``nonce``: the
    request's nonce, spent here in the statement that stores the liveness (and the telemetry,
    PostgreSQL); a spent one is a replay (409), and nothing is stored. Returns the AgentState and
    whether detection acted.
    """
    now = now or timezone.now()
    if len(gpus) > telemetry.MAX_GPUS_PER_NODE:
        raise DomainError(f"{len(gpus)} GPUs: a node has at most {telemetry.MAX_GPUS_PER_NODE}.", code="too_many")
    stored = known or telemetry.node_known(node)  # the node's GPUs and ports as stored, for ingest too
    known = {row[2] for row in stored.gpus}
    foreign = sorted({str(g.get("uuid")) for g in gpus} - known)
    if foreign:
        raise Forbidden(
            f"This node has no GPU {', '.join(foreign[:3])}; an agent speaks only for its own GPUs.", code="foreign_gpu"
        )
    if len(gpus) > len(known):
        raise DomainError(f"{len(gpus)} GPUs listed, but {node.hostname} has {len(known)}.", code="too_many")
    state = AgentState(node=node, last_seen_at=now, agent_version=agent_version[:32], gpus=gpus)
    if not (samples or ports):
        _agent_state_save(state, nonce=nonce)
        return Heard(state=state, acted=False)
    # The telemetry is checked before anything is written; a refusal keeps the liveness (stored,
    # the nonce spent) and the API answers it. Checked, it is written with the liveness: in the
    # same statement when the nonce is still to be spent (PostgreSQL), after it otherwise.
    # ingest returns each GPU's new sample with the one before it, and each port's link with its
    # recent flaps: failure detection judges that (no query unless something is wrong).
    try:
        checked = telemetry.ingest_check(node=node, samples=samples or [], ports=ports or [], now=now, known=stored)
    except Exception:
        _agent_state_save(state, nonce=nonce)
        raise
    if nonce is not None and connection.vendor == "postgresql":
        try:
            _alive_with_telemetry(state, nonce, checked)
        except IntegrityError:
            # The telemetry no longer fits what is stored (a GPU or port removed since the read):
            # the node is alive all the same -- its liveness alone, then the error as before.
            if connection.in_atomic_block:
                raise
            _agent_state_save(state, nonce=nonce)
            raise
    else:
        _agent_state_save(state, nonce=nonce)
        telemetry.ingest_write(checked)
    return Heard(state=state, acted=bool(judge_samples(node=node, ingested=checked.ingested, now=now)))


class Heard(NamedTuple):
    """A heartbeat stored: the node's AgentState, and whether failure detection acted on its telemetry."""
    state: AgentState
    acted: bool


_AGENT_STATE_SQL = (
    f"INSERT INTO {AgentState._meta.db_table} (node_id, last_seen_at, agent_version, gpus) "  # noqa: S608
    "VALUES (%s, %s, %s, %s::jsonb) ON CONFLICT (node_id) DO UPDATE SET last_seen_at = EXCLUDED.last_seen_at, "
    "agent_version = EXCLUDED.agent_version, gpus = EXCLUDED.gpus"
)
_OWN = {sql: _own_transaction(sql) for sql in (_NONCE_SQL, _AGENT_STATE_SQL)}
# The nonce spent and the liveness stored in one statement: the liveness only when the nonce was
# not spent before. In its own transaction, committed without waiting for the WAL flush.
# The nonce spent, the liveness and the telemetry stored in one statement (telemetry.write_sql with
# these CTEs before it): nothing of it unless the nonce was not spent before.
_SPENT_AND_ALIVE_NAMED = (
    f"spent AS (INSERT INTO {AgentNonce._meta.db_table} (node_id, nonce, seen_at) "  # noqa: S608
    "VALUES (%(node)s, %(nonce)s, %(at)s) ON CONFLICT (node_id, nonce) DO NOTHING RETURNING 1), "
    f"alive AS (INSERT INTO {AgentState._meta.db_table} (node_id, last_seen_at, agent_version, gpus) "
    "SELECT %(node)s, %(at)s, %(version)s, %(gpus)s::jsonb WHERE EXISTS (SELECT FROM spent) "
    "ON CONFLICT (node_id) DO UPDATE SET last_seen_at = EXCLUDED.last_seen_at, "
    "agent_version = EXCLUDED.agent_version, gpus = EXCLUDED.gpus RETURNING 1),"
)
# Without telemetry (a heartbeat that carries none, or whose telemetry was refused): the CTEs alone.
_SPEND_AND_KEEP_ALIVE = {  # by whether a caller's transaction is open
    True: f"WITH {_SPENT_AND_ALIVE_NAMED.rstrip(',')} SELECT EXISTS (SELECT FROM spent)",  # noqa: S608
    False: f"WITH {_SPENT_AND_ALIVE_NAMED.rstrip(',')} "  # noqa: S608
           "SELECT set_config('synchronous_commit', 'off', true), EXISTS (SELECT FROM spent)",
}
_ALIVE_WITH_TELEMETRY = {  # by whether a caller's transaction is open (its durability left alone)
    in_atomic: write_sql(before=_SPENT_AND_ALIVE_NAMED, guard="EXISTS (SELECT FROM spent)",
                         result="EXISTS (SELECT FROM spent)", commit_async=not in_atomic)
    for in_atomic in (True, False)
}


def _alive_with_telemetry(state: AgentState, nonce: str, checked: Checked) -> None:
    """
    The heartbeat's nonce spent, its liveness and its checked telemetry (``telemetry.Checked``)
    stored: one statement, committed without waiting for the WAL flush as each of them was alone.
    A spent nonce: Replayed, and nothing stored.
    """
    params = {**write_params(checked), "nonce": nonce, "version": state.agent_version, "gpus": json.dumps(state.gpus)}
    with fast_cursor() as cursor:
        cursor.execute(_ALIVE_WITH_TELEMETRY[connection.in_atomic_block], params)
        if not cursor.fetchone()[-1]:
            raise Replayed()


def _agent_state_save(state: AgentState, *, nonce: str | None = None) -> None:
    """
    One upsert: a prepared statement on PostgreSQL (every node, every heartbeat), the ORM elsewhere.
    Committed without waiting for the WAL flush, as the telemetry is (cloud.telemetry.ingestion):
    a crash may lose the last fraction of a second of liveness, which the next heartbeat brings back.
    With ``nonce`` (PostgreSQL) the same statement spends the request's nonce first (Replayed, and
    nothing stored, when it was spent before): ``_nonce_spend``'s reasoning holds, the nonce's row
    committing with the liveness, before the telemetry.
    """
    if connection.vendor == "postgresql":
        row = [state.node_id, state.last_seen_at, state.agent_version, json.dumps(state.gpus)]
        if nonce is None:
            _write(_AGENT_STATE_SQL, row)
            return
        params = {"node": state.node_id, "nonce": nonce, "at": state.last_seen_at, "version": state.agent_version,
                  "gpus": row[3]}
        with fast_cursor() as cursor:
            cursor.execute(_SPEND_AND_KEEP_ALIVE[connection.in_atomic_block], params)
            if not cursor.fetchone()[-1]:
                raise Replayed()
        return
    if nonce is not None and not _nonce_spend(node=state.node, nonce=nonce, now=state.last_seen_at):
        raise Replayed()  # (authenticate spends it itself here; never left unspent)
    AgentState.objects.bulk_create(
        [state], update_conflicts=True, unique_fields=["node"], update_fields=["last_seen_at", "agent_version", "gpus"]
    )


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
    gpus, live, _ = _desired(node)
    return _policy(gpus, live)


def heartbeat_answer(*, node: Node, held: str | None, desired: tuple | None = None) -> dict:
    """
    What the answer to a heartbeat tells the agent, read in one statement: the version of its
    policy always, the policy itself only when it is not the one the agent holds (``held``, the
    version it sent; none from an older agent, which gets the whole policy every time), and
    whether commands wait for it (when none do, the agent does not ask for them). The policy is
    computed from the live instances on every heartbeat and never cached: what changed since the
    last heartbeat (a tenant placed, released, moved, a MIG GPU handed over) shows in the very
    next answer. A command enqueued just after the answer is pulled on the next turn. ``desired``
    is ``_desired(node)`` when the caller read it already.
    """
    gpus, live, commands_waiting = desired or _desired(node)
    policy = _policy(gpus, live)
    version = policy_version(policy)
    answer = {"policy_version": version, "commands_waiting": commands_waiting}
    if held != version:
        answer["policy"] = policy
    return answer


def policy_version(policy: list[dict]) -> str:
    """A fingerprint of the policy itself: the same policy has the same version, any change another."""
    canonical = json.dumps(policy, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:32]


def _policy(gpus: list, live: list) -> list[dict]:
    """The policy of ``_desired``'s GPUs and live instances."""
    owners: dict[str, dict] = {}
    modes: dict[str, str] = {}
    layouts: dict[str, str] = {}
    aliases: dict[str, dict] = {}  # GPU -> {the runtime's id of an owner: the owner}
    slices: dict[str, int] = {}  # GPU -> the slice length (ms) of its time-sliced owners' class
    for name, state, runtime_uid, devices, offering_id, slots_per_gpu, isolation_mode, slice_class in live:
        for device in devices:
            gpu = device["gpu_id"]
            owners.setdefault(gpu, {})[name] = _memory_cap(device, slots_per_gpu, isolation_mode)
            if runtime_uid:
                aliases.setdefault(gpu, {})[runtime_uid] = name
            modes[gpu] = _MODES.get(isolation_mode, EXCLUSIVE)
            if slice_class:
                slices[gpu] = TIME_SLICE_MS[slice_class]
            if isolation_mode == IsolationMode.MIG and state == InstanceState.ACTIVE:
                # Enforced once handed over: until then provisioning is still cutting the GPU. The
                # offering is read as far as the layout needs (its other fields load when read).
                offering = Offering.from_db(
                    DEFAULT_DB_ALIAS,
                    ["id", "slots_per_gpu", "isolation_mode"],
                    [offering_id, slots_per_gpu, isolation_mode],
                )
                layouts[gpu] = mig_layout_for(offering)
    return [
        {
            "index": index,
            "mode": modes.get(gpu, EXCLUSIVE),
            "owners": owners.get(gpu, {}),
            "mig_layout": layouts.get(gpu),
            "time_slice_ms": slices.get(gpu),
            "aliases": aliases.get(gpu, {}),
        }
        for gpu, index in gpus
    ]


# A time-sliced GPU is shared with memory caps too: the watchdog holds each task to its cap.
_MODES = {IsolationMode.MIG: MIG, IsolationMode.SHARED: SHARED, IsolationMode.TIME_SLICED: SHARED}


def _memory_cap(device: dict, slots_per_gpu: int, isolation_mode: str) -> int | None:
    """An owner's cap on a shared GPU (MiB): its slot, less the headroom a time-sliced task leaves; None: whole."""
    if slots_per_gpu == 1:
        return None
    width = device["mem_hi"] - device["mem_lo"]
    return int(width * TIME_SLICE_MEMORY_SHARE) if isolation_mode == IsolationMode.TIME_SLICED else width


_LIVE = (InstanceState.PROVISIONING, InstanceState.ACTIVE)
_WAITING = (AgentCommand.State.PENDING, AgentCommand.State.SENT)  # what commands_take hands out
_DESIRED_COLUMNS = (  # the node as %(node)s
    "(SELECT json_agg(json_build_array(g.id, g.index) ORDER BY g.index) "  # noqa: S608 -- our own names
    f"FROM {GPU._meta.db_table} g WHERE g.node_id = %(node)s)::text, "
    "(SELECT json_agg(json_build_array(i.name, i.state, i.runtime_uid, i.devices, o.id, o.slots_per_gpu, "
    "o.isolation_mode, o.time_slice_class) ORDER BY i.reservation_id, i.index) "
    f"FROM {Instance._meta.db_table} i JOIN {Reservation._meta.db_table} r ON r.id = i.reservation_id "
    f"JOIN {Offering._meta.db_table} o ON o.id = r.offering_id "
    f"WHERE i.node_id = %(node)s AND i.state IN ({', '.join(repr(str(s)) for s in _LIVE)}))::text, "
    f"EXISTS (SELECT FROM {AgentCommand._meta.db_table} c WHERE c.node_id = %(node)s "
    f"AND c.state IN ({', '.join(repr(str(s)) for s in _WAITING)}))"
)
_DESIRED_SQL = f"SELECT {_DESIRED_COLUMNS}"  # noqa: S608 -- our own names
# The key, its node and the node's TurnRead: the node's subqueries correlated to the key's node.
_CREDENTIAL_TURN_SQL = (
    f"{_CREDENTIAL_SELECT}, {NODE_KNOWN_COLUMNS}, {_DESIRED_COLUMNS}{_CREDENTIAL_FROM}".replace("%(node)s", "n.id")
)


def _desired(node: Node) -> tuple[list, list, bool]:
    """
    The node's GPUs as (id, index) by index, its live instances as (name, state, runtime_uid,
    devices, offering id, slots_per_gpu, isolation_mode, time_slice_class), and whether commands wait for its agent:
    one prepared statement on PostgreSQL (every heartbeat asks it).
    """
    if connection.vendor != "postgresql":
        gpus = [(str(pk), index) for pk, index in node.gpus.order_by("index").values_list("pk", "index")]
        live = list(
            Instance.objects.filter(node=node, state__in=_LIVE)
            .order_by("reservation_id", "index")
            .values_list(
                "name",
                "state",
                "runtime_uid",
                "devices",
                "reservation__offering_id",
                "reservation__offering__slots_per_gpu",
                "reservation__offering__isolation_mode",
                "reservation__offering__time_slice_class",
            )
        )
        return gpus, live, AgentCommand.objects.filter(node=node, state__in=_WAITING).exists()

    with fast_cursor() as cursor:
        cursor.execute(_DESIRED_SQL, {"node": node.pk})
        return _desired_from_columns(*cursor.fetchone())


def _desired_from_columns(gpus: str | None, live: str | None, waiting: bool) -> tuple[list, list, bool]:
    return json.loads(gpus or "[]"), json.loads(live or "[]"), waiting


def _turn_read(known_gpus: str | None, known_ports: str | None, *desired) -> TurnRead:
    return TurnRead(known=known_from_columns(known_gpus, known_ports), desired=_desired_from_columns(*desired))


@transaction.atomic
def violations_report(*, node: Node, violations: list[dict]) -> int:
    """
    What the agent's watchdog found and did: each violation is an incident (for the tenants whose
    GPU it was) and an audit event; a GPU whose MIG layout is wrong is quarantined, and the work
    on it is replaced (provisioning.lifecycle.replacement.gpus_failed).
    """
    gpus = {gpu.index: gpu for gpu in node.gpus.all()}
    live = list(
        Instance.objects.filter(node=node, state__in=[InstanceState.PROVISIONING, InstanceState.ACTIVE]).only(
            "tenant_id", "devices"
        )
    )
    held: dict = {}  # GPUs quarantined now under tenants' work: id -> what was found
    for violation in violations:
        gpu = gpus.get(int(violation["index"]))
        if gpu is None:
            raise Forbidden(f"This node has no GPU {violation['index']}.", code="foreign_gpu")
        # Matched here, not by a JSON lookup: SQLite (the embedded default) has no JSON containment.
        tenants = sorted({str(i.tenant_id) for i in live if any(d["gpu_id"] == str(gpu.pk) for d in i.devices)})
        summary = f"{node.hostname} GPU {gpu.index}: {violation['kind']} -- {violation['detail']}"[:500]
        Incident.objects.create(
            kind=f"isolation_{violation['kind']}",
            node_id=node.pk,
            summary=summary,
            tenant_id=tenants[0] if len(tenants) == 1 else None,
            evidence={"gpu": gpu.uuid, **{k: violation.get(k) for k in ("kind", "action", "detail", "owner", "pids")}},
        )
        audit_record(
            actor=None,
            action="isolation.violation",
            target=node,
            tenant_id=None,
            after={"gpu": gpu.index, "kind": violation["kind"], "action": violation["action"]},
        )
        if violation["action"] == "quarantine_gpu" and gpu.state != GPUState.QUARANTINED:
            GPU.objects.filter(pk=gpu.pk).update(state=GPUState.QUARANTINED)
            if tenants:
                held[gpu.pk] = summary
    if held:
        # Tenants' work on a GPU held for isolation moves to sound GPUs (the GPU is used again
        # only after the node's validation): provisioning.lifecycle.replacement, as for a failed GPU.
        now = timezone.now()
        gpus_failed(
            node=node,
            gpu_ids=list(held),
            cause="isolation",
            summary="; ".join(held.values())[:500],
            evidence={"violations": len(violations)},
            impact_started_at=now,
            detected_at=now,
        )
    return len(violations)


def command_answered(*, node: Node, command_id, ok: bool, result: dict) -> AgentCommand:
    """
    An agent's answer to one of its commands, recorded (``provisioning.agents.commands``); the
    answer to a GPU reset is then judged: the GPU back in service after a clean sample, or escalated.
    """
    command = command_answer(node=node, command_id=command_id, ok=ok, result=result)
    if command.kind == "reset_gpu":
        gpu_reset_answered(command=command)
    return command
