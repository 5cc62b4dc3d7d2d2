"""
Ingestion of one heartbeat's GPU samples and HCA port states.

Everything is checked before anything is written (ENGINEERING.md §7, the node agent's bad
inputs); then, whatever the GPU count, one read and one write. On PostgreSQL -- 128 heartbeats a
second for a 10,240-GPU region -- both are prepared once per connection (server-side binding):
the read returns the node's GPUs with their latest samples and its ports with their status as
JSON; the write is one statement whose data-modifying CTEs insert the raw samples, upsert the
latest sample per GPU (INSERT ... ON CONFLICT DO UPDATE) and upsert the port states that are due,
from two JSON arrays. (The raw samples ride in that statement rather than in a COPY of their own:
for 8 rows a second statement and its protocol exchange cost more than they save.) One statement
is atomic by itself, so no BEGIN and COMMIT round trips are spent on it when the caller holds no
transaction. Its transaction commits without waiting for the WAL flush (``synchronous_commit``
off, for it alone): a crash may lose the last fraction of a second of samples, never half of a
heartbeat, and every other write of the control plane stays synchronous. On SQLite (the embedded
default) the same rows are written through the ORM, in a transaction.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from uuid import UUID

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from cloud.models import GPU, GPUSample, GPUTelemetry, HCAPort, HCAPortStatus, Node, PortLink, TelemetrySource
from core.db import fast_cursor
from core.errors import DomainError, Forbidden

log = logging.getLogger(__name__)

MAX_GPUS_PER_NODE = 64  # refused before any query: a body cannot make the server loop over 10^5 entries
MAX_PORTS_PER_NODE = 64
MAX_XIDS_PER_SAMPLE = 64
MAX_TEMPERATURE_C = 200
MAX_NVLINKS = 64  # more links than any GPU has (NVML asks up to 36)
# A port's status is written when its link changes, and otherwise at most this often (``seen_at``
# says when it was last confirmed): rewriting eight unchanged rows every heartbeat buys nothing.
PORT_REFRESH = timedelta(seconds=60)
_GUID = re.compile(r"^(0x)?([0-9a-f]{1,16})$")

# The readings of a sample: name -> (kind, upper bound). Lower bounds are 0: a negative reading is refused.
READINGS = {
    "utilization_pct": (int, 100),
    "memory_used_mib": (int, 2**31 - 1),
    "memory_total_mib": (int, 2**31 - 1),
    "temperature_c": (int, MAX_TEMPERATURE_C),
    "power_w": (float, 100_000.0),
    "ecc_corrected": (int, 2**63 - 1),
    "ecc_uncorrected": (int, 2**63 - 1),
    "processes": (int, 32_767),
    "nvlink_up": (int, MAX_NVLINKS),
    "nvlink_total": (int, MAX_NVLINKS),
    "time_slice_ms": (int, 10_000),
}
SAMPLE_FIELDS = (
    "utilization_pct",
    "memory_used_mib",
    "temperature_c",
    "power_w",
    "ecc_corrected",
    "ecc_uncorrected",
    "processes",
)
LATEST_FIELDS = (
    "sampled_at",
    "utilization_pct",
    "memory_used_mib",
    "memory_total_mib",
    "temperature_c",
    "power_w",
    "ecc_corrected",
    "ecc_uncorrected",
    "processes",
    "nvlink_up",
    "nvlink_total",
    "time_slice_ms",
    "xids",
    "source",
)
PORT_FIELDS = ("id", "link", "changed_at", "changes", "window_started_at", "seen_at")


class BadTelemetry(DomainError):
    default_code = "bad_telemetry"
    default_detail = "The telemetry in this heartbeat is not valid."


@dataclass(frozen=True)
class GPUReading:
    """One GPU's new sample and the latest one before it (None: its first), as plain dicts."""

    gpu_id: object
    index: int
    uuid: str
    sample: dict
    previous: dict | None


@dataclass(frozen=True)
class PortReading:
    """One port's link now and before (None: first seen), and its up/down changes inside the flap window."""

    port_id: int
    guid: str
    link: str
    previous: str | None
    changes_in_window: int


@dataclass(frozen=True)
class Ingested:
    gpus: list[GPUReading]
    ports: list[PortReading]


@dataclass(frozen=True)
class Known:
    """
    What is stored of a node before a heartbeat: per GPU (id, index, uuid, *LATEST_FIELDS of its
    latest sample or Nones); per port GUID (port id, link, changed_at, changes, window_started_at,
    seen_at), times in Unix seconds.
    """

    gpus: list[tuple]
    ports: dict


def ingest(
    *,
    node: Node,
    samples: list,
    ports: list,
    now: datetime | None = None,
    source: str = TelemetrySource.AGENT,
    known: Known | None = None,
) -> Ingested:
    """
    Store one heartbeat's ``samples`` (one per GPU of ``node``) and ``ports`` (the link of HCA
    ports of ``node`` by GUID). A reading out of range, a malformed entry or more samples than the
    node has GPUs is a 400 (BadTelemetry), a GPU of another node a 403; then nothing is stored.
    Every such refusal is raised before the one write, so a caller may catch it and keep its own
    writes (the heartbeat's liveness, operations.node_api.agents.heartbeat). A port GUID that is not
    one of the node's HCAPorts (an SR-IOV virtual function, a newly fitted HCA) is skipped and
    logged, never refused: the rest of the heartbeat is stored. Fields it does not know are
    ignored. ``known`` is ``node_known(node)`` when the caller read it already. Returns each GPU's
    new and previous sample and each port's link and recent flaps: what failure detection
    (cloud.health) evaluates, with no further query.
    """
    checked = ingest_check(node=node, samples=samples, ports=ports, now=now, source=source, known=known)
    ingest_write(checked)
    return checked.ingested


def ingest_write(checked: Checked) -> None:
    """Write what ``ingest_check`` passed: one statement on PostgreSQL, atomic on its own."""
    if not (checked.readings or checked.due):
        return
    if connection.vendor == "postgresql":
        with fast_cursor() as cursor:
            cursor.execute(_WRITE_SQL, write_params(checked))
        return
    with transaction.atomic(savepoint=False):
        _write_portable(checked.node, checked.readings, checked.due)


@dataclass
class Checked:
    """A heartbeat's telemetry checked and matched to the node's GPUs and ports, not yet written."""

    node: Node
    readings: list[GPUReading]
    due: list[tuple]  # port status rows to write (port_updates')
    now: datetime
    source: str
    ingested: Ingested


def ingest_check(
    *,
    node: Node,
    samples: list,
    ports: list,
    now: datetime | None = None,
    source: str = TelemetrySource.AGENT,
    known: Known | None = None,
) -> Checked:
    """
    ``ingest`` up to its write: every refusal raised, nothing written; write what it returns with
    ``ingest_write``, or with ``write_params`` in a caller's own statement (``write_sql``).
    """
    now = now or timezone.now()
    if not isinstance(samples, list) or not isinstance(ports, list):
        raise BadTelemetry("samples and ports must be lists.")
    if len(samples) > MAX_GPUS_PER_NODE:
        raise BadTelemetry(f"{len(samples)} samples: a node has at most {MAX_GPUS_PER_NODE} GPUs.", code="too_many")
    if len(ports) > MAX_PORTS_PER_NODE:
        raise BadTelemetry(f"{len(ports)} ports: a node has at most {MAX_PORTS_PER_NODE} ports.", code="too_many")
    checked = [_check_sample(position, sample) for position, sample in enumerate(samples)]
    links = [_check_port(position, port) for position, port in enumerate(ports)]
    known = known or node_known(node)
    readings = _match(node, checked, known.gpus, now, source) if checked else []
    port_rows = port_updates(node, links, now, source, known.ports) if links else []
    return Checked(node=node, readings=readings, due=[write for write, _ in port_rows if write], now=now,
                   source=source, ingested=Ingested(gpus=readings, ports=[reading for _, reading in port_rows]))


#
# Checks
#


def _check_sample(position: int, sample) -> dict:
    """The sample's readings as stored (None where the GPU does not offer one); BadTelemetry otherwise."""
    if not isinstance(sample, dict):
        raise BadTelemetry(f"Sample {position} is not an object.")
    uuid = sample.get("uuid")
    if not isinstance(uuid, str) or not 0 < len(uuid) <= 64:
        raise BadTelemetry(f"Sample {position} needs the GPU's uuid (a string of at most 64 characters).")
    checked = {"uuid": uuid}
    for name, (kind, upper) in READINGS.items():
        value = sample.get(name)
        if value is None:
            checked[name] = None
            continue
        if value.__class__ not in (int, float) or (  # a bool is not a reading, nor 1.5 errors
            kind is int and value.__class__ is float and not value.is_integer()
        ):
            wanted = "an integer" if kind is int else "a number"
            raise BadTelemetry(f"Sample {position} ({uuid}): {name} must be {wanted}.")
        if not 0 <= value <= upper:
            problem = "negative" if value < 0 else f"over {upper}" if value > upper else "not a number"
            raise BadTelemetry(f"Sample {position} ({uuid}): {name} {value} is {problem}.", code="out_of_range")
        checked[name] = kind(value)
    up, links = checked["nvlink_up"], checked["nvlink_total"]
    if up is not None and links is not None and up > links:
        raise BadTelemetry(f"Sample {position} ({uuid}): nvlink_up {up} is more than nvlink_total {links}.",
                           code="out_of_range")
    used, total = checked["memory_used_mib"], checked["memory_total_mib"]
    if used is not None and total is not None and used > total:
        raise BadTelemetry(
            f"Sample {position} ({uuid}): memory_used_mib {used} is more than memory_total_mib {total}.",
            code="out_of_range",
        )
    xids = sample.get("xids")
    xids = [] if xids is None else xids
    if (
        not isinstance(xids, list)
        or len(xids) > MAX_XIDS_PER_SAMPLE
        or not all(x.__class__ is int and 0 <= x <= 65_535 for x in xids)
    ):
        raise BadTelemetry(
            f"Sample {position} ({uuid}): xids must be a list of at most {MAX_XIDS_PER_SAMPLE} "
            "XID codes (integers 0-65535)."
        )
    checked["xids"] = list(xids)
    return checked


def _check_port(position: int, port) -> tuple[str, str]:
    if not isinstance(port, dict):
        raise BadTelemetry(f"Port {position} is not an object.")
    guid = port.get("guid")
    match = _GUID.match(guid.strip().lower()) if isinstance(guid, str) else None
    if match is None:
        raise BadTelemetry(f"Port {position}: guid must be a 64-bit port GUID (16 hex digits).")
    link = port.get("link")
    if link not in (PortLink.UP, PortLink.DOWN):
        raise BadTelemetry(f"Port {position}: link must be 'up' or 'down'.")
    return match.group(2).rjust(16, "0"), link


#
# Reads: the node's GPUs and ports with what is stored of them
#

# Only our own table and column names are put into these statements. Rows come back as JSON
# text, parsed by the json module: cheaper than loading each column of each row one by one. Each
# GPU's latest sample and each port's status are correlated subqueries, so they are always probed
# by primary key whatever the planner's statistics say (a join planned on the stale statistics of
# a freshly filled table scanned all 10,240 latest rows on every heartbeat). The select list is
# public (the node as ``%(node)s``): a caller that reads more of the node in the same turn puts it
# in its own statement (operations.node_api.agents reads the desired state with it).
NODE_KNOWN_COLUMNS = (
    "(SELECT json_agg(json_build_array(g.id, g.index, g.uuid, "  # noqa: S608
    f"(SELECT json_build_array({', '.join(f't.{f}' for f in LATEST_FIELDS)}) "
    f"FROM {GPUTelemetry._meta.db_table} t WHERE t.gpu_id = g.id))) "
    f"FROM {GPU._meta.db_table} g WHERE g.node_id = %(node)s)::text, "
    "(SELECT json_agg(json_build_array(p.guid, p.id, (SELECT json_build_array(s.link, "
    "EXTRACT(EPOCH FROM s.changed_at), s.changes, EXTRACT(EPOCH FROM s.window_started_at), "
    f"EXTRACT(EPOCH FROM s.seen_at)) FROM {HCAPortStatus._meta.db_table} s WHERE s.port_id = p.id))) "
    f"FROM {HCAPort._meta.db_table} p WHERE p.node_id = %(node)s)::text"
)
_NODE_SQL = f"SELECT {NODE_KNOWN_COLUMNS}"  # noqa: S608 -- our own names
_NO_LATEST = (None,) * len(LATEST_FIELDS)
_NO_STATUS = (None,) * (len(PORT_FIELDS) - 1)
# Port times as Unix seconds: the flap arithmetic needs no datetime objects.
_PORTS_SQL = (
    "SELECT p.node_id, p.guid, p.id, s.link, EXTRACT(EPOCH FROM s.changed_at)::float8, s.changes, "  # noqa: S608
    "EXTRACT(EPOCH FROM s.window_started_at)::float8, EXTRACT(EPOCH FROM s.seen_at)::float8 "
    f"FROM {HCAPort._meta.db_table} p LEFT JOIN {HCAPortStatus._meta.db_table} s ON s.port_id = p.id "
    "WHERE p.node_id = ANY(%s)"
)


def node_known(node: Node) -> Known:
    """The node's GPUs with their latest samples, and its ports with their status: one query on PostgreSQL."""
    if connection.vendor != "postgresql":
        columns = ("id", "index", "uuid", *(f"telemetry__{f}" for f in LATEST_FIELDS))
        return Known(
            gpus=list(GPU.objects.filter(node=node).order_by().values_list(*columns)),
            ports=known_ports([node])[node.pk],
        )
    with fast_cursor() as cursor:
        cursor.execute(_NODE_SQL, {"node": node.pk})
        return known_from_columns(*cursor.fetchone())


def known_from_columns(gpus: str | None, ports: str | None) -> Known:
    """``Known`` from the two columns of NODE_KNOWN_COLUMNS (JSON text, None where the node has none)."""
    rows = []
    for gpu_id, index, uuid, latest in json.loads(gpus or "[]"):
        sampled_at, *readings = latest or _NO_LATEST
        rows.append((UUID(gpu_id), index, uuid, sampled_at and datetime.fromisoformat(sampled_at), *readings))
    return Known(
        gpus=rows,
        ports={guid: (port_id, *(status or _NO_STATUS)) for guid, port_id, status in json.loads(ports or "[]")},
    )


def known_ports(nodes: list[Node]) -> dict:
    """
    {node id: {guid: (port id, link, changed_at, changes, window_started_at, seen_at)}} in one
    query, the times as Unix seconds (None where there is no status yet).
    """
    known: dict = {node.pk: {} for node in nodes}
    if connection.vendor == "postgresql":
        with fast_cursor() as cursor:
            cursor.execute(_PORTS_SQL, [[node.pk for node in nodes]])
            rows = cursor.fetchall()
    else:
        rows = [
            (node_id, guid, port_id, link, _ts(changed), changes, _ts(started), _ts(seen))
            for node_id, guid, port_id, link, changed, changes, started, seen in HCAPort.objects.filter(node__in=nodes)
            .order_by()
            .values_list("node_id", "guid", *(f"status__{f}" if f != "id" else f for f in PORT_FIELDS))
        ]
    for node_id, guid, *row in rows:
        known[node_id][guid] = row
    return known


def _ts(moment: datetime | None) -> float | None:
    return None if moment is None else moment.timestamp()


def _dt(seconds: float | None) -> datetime | None:
    return None if seconds is None else datetime.fromtimestamp(seconds, UTC)


def _match(node: Node, checked: list[dict], known_rows: list[tuple], now: datetime, source: str) -> list[GPUReading]:
    """Each sample's GPU among the node's: 403 for a GPU of another node, 400 for more samples than GPUs."""
    known = {row[2]: row for row in known_rows}
    if len(checked) > len(known):
        raise BadTelemetry(f"{len(checked)} samples, but {node.hostname} has {len(known)} GPUs.", code="too_many")
    readings, seen = [], set()
    for sample in checked:
        uuid = sample["uuid"]
        row = known.get(uuid)
        if row is None:
            raise Forbidden(f"This node has no GPU {uuid}; an agent speaks only for its own GPUs.", code="foreign_gpu")
        if uuid in seen:
            raise BadTelemetry(f"GPU {uuid} is sampled twice in one heartbeat.", code="duplicate")
        seen.add(uuid)
        previous = dict(zip(LATEST_FIELDS, row[3:], strict=True)) if row[3] is not None else None
        sample.pop("uuid")
        sample.update(sampled_at=now, source=source)
        readings.append(GPUReading(gpu_id=row[0], index=row[1], uuid=uuid, sample=sample, previous=previous))
    return readings


def port_updates(node: Node, links: list[tuple[str, str]], now: datetime, source: str, known: dict) -> list:
    """
    (the row to write or None, PortReading) per reported port. A change of link between up and
    down counts inside the flap window (MERIDIAN_PORT_FLAP_WINDOW_S) that began at the first
    change; a port first seen, or seen again after "unknown", counts no flap. A row to write is
    (port id, link, changed_at, changes, window_started_at, seen_at, source), times in Unix seconds.
    A GUID that is not one of the node's ports (SR-IOV virtual functions show under
    /sys/class/infiniband too; a newly fitted HCA is not registered yet) is skipped, logged once
    with the GUIDs: refusing the heartbeat for it would cost the node its telemetry.
    """
    if len({guid for guid, _ in links}) != len(links):
        raise BadTelemetry("A port is reported twice in one heartbeat.", code="duplicate")
    unknown = sorted(guid for guid, _ in links if guid not in known)
    if unknown:
        log.warning(
            "%s reported %d port(s) it has no HCAPort for, skipped: %s",
            node.hostname,
            len(unknown),
            ", ".join(unknown[:16]) + (" ..." if len(unknown) > 16 else ""),
        )
        links = [(guid, link) for guid, link in links if guid in known]
    window, refresh = settings.MERIDIAN_PORT_FLAP_WINDOW_S, PORT_REFRESH.total_seconds()
    at = now.timestamp()
    rows = []
    for guid, link in links:
        port_id, before, changed_at, changes, started, seen_at = known[guid]
        changes = changes or 0
        if before is not None and link != before:
            changed_at = at
            if before != PortLink.UNKNOWN:
                if started is None or at - started > window:
                    started, changes = at, 1
                else:
                    changes += 1
        elif before is None:
            changed_at = at
        write = before != link or seen_at is None or abs(at - seen_at) >= refresh
        row = (port_id, link, changed_at, changes, started, at, source) if write else None
        reading = PortReading(
            port_id=port_id,
            guid=guid,
            link=link,
            previous=before,
            changes_in_window=0 if started is None or at - started > window else changes,
        )
        rows.append((row, reading))
    return rows


def changes_in_window(status: HCAPortStatus, now: datetime) -> int:
    """The port's up/down changes inside the flap window ending ``now`` (0 once the window has passed)."""
    window = timedelta(seconds=settings.MERIDIAN_PORT_FLAP_WINDOW_S)
    if status.window_started_at is None or now - status.window_started_at > window:
        return 0
    return status.changes


#
# Writes
#

_LATEST_SET = ", ".join(f"{f} = EXCLUDED.{f}" for f in ("node_id", *LATEST_FIELDS))
_PORT_SET = ", ".join(
    f"{f} = EXCLUDED.{f}" for f in ("link", "changed_at", "changes", "window_started_at", "seen_at", "source")
)
# The readings of a sample as the write's JSON carries them, each with its PostgreSQL type.
_SAMPLE_COLUMNS = {
    "utilization_pct": "int2",
    "memory_used_mib": "int4",
    "memory_total_mib": "int4",
    "temperature_c": "int2",
    "power_w": "float8",
    "ecc_corrected": "int8",
    "ecc_uncorrected": "int8",
    "processes": "int2",
    "nvlink_up": "int2",
    "nvlink_total": "int2",
    "time_slice_ms": "int2",
}
_SAMPLE_SELECT = ", ".join(f"(e->>{i})::{kind} AS {name}" for i, (name, kind) in enumerate(_SAMPLE_COLUMNS.items(), 1))
# One statement for a heartbeat, its rows passed as two JSON arrays (one parameter each, cheap to
# send and to parse): the samples, inserted as raw samples and upserted as the latest; the port
# states that are due, upserted. Nothing per GPU, no row written twice. The statement's own
# result sets ``synchronous_commit`` off for its transaction alone (see the module's docstring).
def write_sql(*, before: str = "", guard: str = "", result: str = "", commit_async: bool = True) -> str:
    """
    The write (PostgreSQL). A caller writing more in the same statement gives CTEs to run
    ``before`` (ending in a comma), a ``guard`` (a condition on them: no telemetry row is written
    unless it holds) and the ``result`` it reads back. ``commit_async``: the statement's transaction
    commits without waiting for the WAL flush (False inside a caller's transaction, to leave its
    durability alone).
    """
    where = f" WHERE {guard}" if guard else ""
    returned = ", ".join(
        part for part in ("set_config('synchronous_commit', 'off', true)" if commit_async else "", result) if part
    ) or "TRUE"
    return f"""
WITH {before} s AS (
    SELECT (e->>0)::uuid AS gpu_id,
           {_SAMPLE_SELECT},
           (e->{len(_SAMPLE_COLUMNS) + 1})::jsonb AS xids
    FROM json_array_elements(%(samples)s::json) AS e{where}
), raw AS (
    INSERT INTO {GPUSample._meta.db_table} (gpu_id, sampled_at, {", ".join(SAMPLE_FIELDS)}, xid_count, xids)
    SELECT gpu_id, %(at)s, {", ".join(SAMPLE_FIELDS)}, jsonb_array_length(xids), xids FROM s
), latest AS (
    INSERT INTO {GPUTelemetry._meta.db_table} (gpu_id, node_id, {", ".join(LATEST_FIELDS)})
    SELECT gpu_id, %(node)s, %(at)s, {", ".join(LATEST_FIELDS[1:-1])}, %(source)s FROM s
    ON CONFLICT (gpu_id) DO UPDATE SET {_LATEST_SET}
), ports AS (
    INSERT INTO {HCAPortStatus._meta.db_table} (port_id, link, changed_at, changes, window_started_at,
                                                seen_at, source)
    SELECT (e->>0)::bigint, e->>1, to_timestamp((e->>2)::float8), (e->>3)::int4, to_timestamp((e->>4)::float8),
           to_timestamp((e->>5)::float8), e->>6
    FROM json_array_elements(%(ports)s::json) AS e{where}
    ON CONFLICT (port_id) DO UPDATE SET {_PORT_SET}
)
SELECT {returned}
"""  # noqa: S608


_WRITE_SQL = write_sql()


def write_params(checked: Checked) -> dict:
    """The write's parameters (``samples``, ``ports``, ``at``, ``node``, ``source``)."""
    samples = json.dumps(
        [[str(r.gpu_id), *(r.sample[c] for c in _SAMPLE_COLUMNS), r.sample["xids"]] for r in checked.readings]
    )
    return {"samples": samples, "ports": json.dumps(checked.due), "at": checked.now, "node": checked.node.pk,
            "source": checked.source}


def _write_portable(node: Node, readings: list[GPUReading], ports: list[tuple]) -> None:
    """The same rows through the ORM: three statements (SQLite, the embedded default)."""
    if readings:
        GPUSample.objects.bulk_create(
            [
                GPUSample(
                    gpu_id=r.gpu_id,
                    sampled_at=r.sample["sampled_at"],
                    xid_count=len(r.sample["xids"]),
                    xids=r.sample["xids"],
                    **{f: r.sample[f] for f in SAMPLE_FIELDS},
                )
                for r in readings
            ]
        )
        GPUTelemetry.objects.bulk_create(
            [
                GPUTelemetry(gpu_id=r.gpu_id, node_id=node.pk, **{f: r.sample[f] for f in LATEST_FIELDS})
                for r in readings
            ],
            update_conflicts=True,
            unique_fields=["gpu"],
            update_fields=["node", *LATEST_FIELDS],
        )
    if ports:
        upsert_ports(ports)


def upsert_ports(rows: list[tuple]) -> None:
    """Port status rows as ``port_updates`` gives them, in one upsert through the ORM."""
    HCAPortStatus.objects.bulk_create(
        [
            HCAPortStatus(
                port_id=port_id,
                link=link,
                changed_at=_dt(changed),
                changes=changes,
                window_started_at=_dt(started),
                seen_at=_dt(seen),
                source=source,
            )
            for port_id, link, changed, changes, started, seen, source in rows
        ],
        update_conflicts=True,
        unique_fields=["port"],
        update_fields=["link", "changed_at", "changes", "window_started_at", "seen_at", "source"],
    )
