"""
The control plane's own gauges on ``/metrics``, from :func:`operations.control_plane.read` at
scrape time: are the singleton loops alive and the queues draining.

- ``meridian_control_plane_check{check}``: 1 when this process reaches its database, cache and
  broker and has its migrations applied, else 0; ``check="read"`` is 0 when the state could not
  be read at all (the other gauges are then left out of the scrape).
- ``meridian_migrations_pending``: migrations not applied to the database.
- ``meridian_scheduler_last_cycle_age_seconds`` and ``meridian_scheduler_leader{leader}`` (1, the
  process that ran the last cycle); ``meridian_beat_last_run_age_seconds``: since beat last sent a
  periodic task. An age is ``+Inf`` when none is known: never cycled, never sent.
- ``meridian_celery_workers``: workers that answered a ping within ``PING_TIMEOUT_S``.
- ``meridian_broker_queue_messages{queue}``: messages ready in each queue the workers consume.

The read pings the workers and waits ``PING_TIMEOUT_S`` for their answers, which is most of what
these cost a scrape; in queries, one (beat's last send) beside the readiness probe's ``SELECT 1``.
"""

from __future__ import annotations

import logging
import math

from prometheus_client.core import GaugeMetricFamily

from operations.control_plane import read

log = logging.getLogger(__name__)
PING_TIMEOUT_S = 0.5


def _age(seconds: float | None) -> float:
    return math.inf if seconds is None else float(seconds)


class ControlPlaneCollector:
    """The gauges above; a new one per scrape."""

    def collect(self):
        checks = GaugeMetricFamily("meridian_control_plane_check",
                                   "1 when this process reaches the dependency (database, cache, broker; migrations "
                                   "applied), else 0; read: the control plane's state could be read.",
                                   labels=["check"])
        try:
            status = read(ping_timeout=PING_TIMEOUT_S)
        except Exception:  # a broker or database lost mid-read: the scrape goes on without these figures
            log.warning("The control plane's state could not be read for /metrics.", exc_info=True)
            checks.add_metric(["read"], 0)
            yield checks
            return
        checks.add_metric(["read"], 1)
        for name, check in sorted(status.checks.items()):
            checks.add_metric([name], 1 if check.ok else 0)
        yield checks
        yield GaugeMetricFamily("meridian_migrations_pending", "Database migrations not applied.",
                                value=status.migrations_pending)
        yield GaugeMetricFamily("meridian_scheduler_last_cycle_age_seconds",
                                "Since the scheduler's last cycle finished (+Inf: none known).",
                                value=_age(status.scheduler_last_cycle_age_s))
        leader = GaugeMetricFamily("meridian_scheduler_leader", "The process that ran the scheduler's last cycle (1).",
                                   labels=["leader"])
        if status.scheduler_leader:
            leader.add_metric([status.scheduler_leader], 1)
        yield leader
        yield GaugeMetricFamily("meridian_beat_last_run_age_seconds",
                                "Since beat last sent a periodic task (+Inf: none known).",
                                value=_age(status.beat_last_run_age_s))
        yield GaugeMetricFamily("meridian_celery_workers", "Celery workers that answered a ping.",
                                value=len(status.workers))
        queues = GaugeMetricFamily("meridian_broker_queue_messages", "Messages ready in each broker queue.",
                                   labels=["queue"])
        for queue, messages in sorted(status.queue_depths.items()):
            queues.add_metric([queue], messages)
        yield queues


__all__ = ["PING_TIMEOUT_S", "ControlPlaneCollector"]
