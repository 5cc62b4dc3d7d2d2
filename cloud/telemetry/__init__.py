"""
GPU telemetry: what the node agents sample, stored cheaply and kept while it is useful.

- ``ingest`` (ingestion.py): one heartbeat's GPU samples and HCA port states, checked (ENGINEERING.md
  §7) and written in a fixed number of statements whatever the GPU count. It returns, per GPU,
  the new sample and the one before it, and per port its link and recent flaps: what failure
  detection (``cloud.health.evaluate_gpu`` / ``evaluate_port``) needs, with no further query.
- ``rollup`` / ``prune`` (rollups.py): raw -> 1-minute -> 1-hour buckets in SQL, idempotent;
  retention by ``MERIDIAN_TELEMETRY_RETENTION``.
- ``gpu_series`` / ``gpus_series`` / ``held_telemetry`` (reads.py): the staff and tenant reads.

Times are the control plane's (the agent's clock is trusted only as far as the request signature).
"""

from cloud.telemetry.ingestion import (
    LATEST_FIELDS,
    MAX_GPUS_PER_NODE,
    MAX_PORTS_PER_NODE,
    NODE_KNOWN_COLUMNS,
    BadTelemetry,
    Checked,
    GPUReading,
    Ingested,
    Known,
    PortReading,
    changes_in_window,
    ingest,
    ingest_check,
    ingest_write,
    known_from_columns,
    node_known,
    write_params,
    write_sql,
)
from cloud.telemetry.reads import (
    PERIODS,
    gpu_error_history,
    gpu_series,
    gpus_series,
    held_telemetry,
    latest_dict,
    rollup_point,
)
from cloud.telemetry.rollups import RAW, ROLLUP_GRACE, prune, rollup

__all__ = [
    "LATEST_FIELDS",
    "MAX_GPUS_PER_NODE",
    "MAX_PORTS_PER_NODE",
    "NODE_KNOWN_COLUMNS",
    "PERIODS",
    "RAW",
    "ROLLUP_GRACE",
    "BadTelemetry",
    "Checked",
    "GPUReading",
    "Ingested",
    "Known",
    "PortReading",
    "changes_in_window",
    "gpu_error_history",
    "gpu_series",
    "gpus_series",
    "ingest",
    "ingest_check",
    "ingest_write",
    "known_from_columns",
    "latest_dict",
    "node_known",
    "prune",
    "held_telemetry",
    "rollup",
    "rollup_point",
    "write_params",
    "write_sql",
]
