"""Periodic housekeeping of provisioning; thin wrappers around services."""

from datetime import timedelta

from celery import shared_task
from django.utils import timezone

IDEMPOTENCY_KEY_TTL = timedelta(hours=24)


@shared_task(name="provisioning.idempotency_key_prune")
def idempotency_key_prune() -> int:
    """Forget Idempotency-Keys after a day, as Stripe does; a later retry is a new request."""
    from provisioning.models import IdempotencyKey

    deleted, _ = IdempotencyKey.objects.filter(created_at__lt=timezone.now() - IDEMPOTENCY_KEY_TTL).delete()
    return deleted


# The lifecycle: thin tasks over provisioning.lifecycle. Late acknowledgement and redelivery on
# a lost worker come from the Celery settings; each task is safe to run twice.


@shared_task(name="provisioning.operation_step")
def operation_step(operation_id: str | list[str], step: str, dispatch: str | None = None) -> str | dict[str, str]:
    """
    Run a step of a provisioning, release or validation operation -- or of a batch of them, sent
    together -- and the quick ones after it.
    """
    from provisioning.lifecycle.runner import operation_run_step

    return operation_run_step(operation_id, step, dispatch)


@shared_task(name="provisioning.reservation_start")
def reservation_start(reservation_id: str) -> bool:
    """Begin provisioning a reservation whose window opened (the tick retries if its nodes are busy)."""
    from provisioning.lifecycle.start import reservation_provision_start

    return reservation_provision_start(reservation_id) is not None


@shared_task(name="provisioning.reservation_start_many")
def reservation_start_many(reservation_ids: list[str]) -> int:
    """``reservation_start`` for a few reservations placed together (one message for them all)."""
    from provisioning.lifecycle.start import reservations_start

    return reservations_start(reservation_ids)


@shared_task(name="provisioning.lifecycle_tick")
def lifecycle_tick() -> dict:
    """Start what is due, release what ended, validate waiting nodes, resume or fail stuck work."""
    from provisioning.lifecycle.tick import tick

    return tick()


@shared_task(name="provisioning.history_sample")
def history_sample() -> dict:
    """The queue's and the fleet's sample for the console's charts (provisioning.history)."""
    from provisioning.history import history_sample as sample

    return sample()


@shared_task(name="provisioning.no_show_scan")
def no_show_scan() -> dict:
    """Warn idle reservations, release no-shows, reclaim GPUs held past the end (provisioning.lifecycle.no_shows)."""
    from provisioning.lifecycle.no_shows import no_show_scan as no_show_scan_service

    return no_show_scan_service()


@shared_task(name="provisioning.node_failed")
def node_failed(node_id: str, cause: str, summary: str, evidence: dict, impact_started_at: str | None,
                detected_at: str | None = None) -> str | None:
    """
    Detection found a node failed for good (times as ISO 8601): mark it faulty, open the incidents,
    replace its tenants' work (provisioning.lifecycle.replacement.node_failed; a repeat is a no-op).
    """
    from django.utils.dateparse import parse_datetime

    from cloud.models import Node
    from provisioning.lifecycle.replacement import node_failed as node_failed_service

    node = Node.objects.filter(pk=node_id).first()
    if node is None:
        return None
    incident = node_failed_service(node=node, cause=cause, summary=summary, evidence=evidence,
                                   impact_started_at=parse_datetime(impact_started_at) if impact_started_at else None,
                                   detected_at=parse_datetime(detected_at) if detected_at else None)
    return str(incident.pk)


@shared_task(name="provisioning.gpus_failed")
def gpus_failed(node_id: str, gpu_ids: list[str], cause: str, summary: str, evidence: dict,
                impact_started_at: str | None, detected_at: str | None = None) -> str | None:
    """GPUs of a node failed for good: provisioning.lifecycle.replacement.gpus_failed (a repeat is a no-op)."""
    from django.utils.dateparse import parse_datetime

    from cloud.models import Node
    from provisioning.lifecycle.replacement import gpus_failed as gpus_failed_service

    node = Node.objects.filter(pk=node_id).first()
    if node is None:
        return None
    incident = gpus_failed_service(node=node, gpu_ids=gpu_ids, cause=cause, summary=summary, evidence=evidence,
                                   impact_started_at=parse_datetime(impact_started_at) if impact_started_at else None,
                                   detected_at=parse_datetime(detected_at) if detected_at else None)
    return str(incident.pk)


# IB-VPCs


@shared_task(name="provisioning.vpc_sync", bind=True, max_retries=8)
def vpc_sync_task(self, vpc_id: str) -> str:
    """Program a VPC's partition on its fabric (or remove it); a transient fabric error retries with backoff."""
    from provisioning.drivers import DriverError
    from provisioning.networks.vpcs import vpc_sync

    try:
        return vpc_sync(vpc_id)
    except DriverError as exc:
        # The reconciler pushes it through later if the retries run out.
        raise self.retry(exc=exc, countdown=min(2 ** self.request.retries, 60)) from exc


@shared_task(name="provisioning.fabrics_reconcile")
def fabrics_reconcile() -> dict:
    """Compare every fabric's partitions with the database, repair the drift, record what was done."""
    from cloud.models import Fabric
    from provisioning.networks.ports import fabric_reconcile

    runs = [fabric_reconcile(fabric) for fabric in Fabric.objects.select_related("region")]
    return {"fabrics": len(runs), "failed": sum(not run.ok for run in runs),
            "repairs": sum(len(run.drift) for run in runs)}


# Named under tenants: a task name is what queues and the beat schedule hold, so it does not follow the code.
@shared_task(name="tenants.hp_revoke_due")
def hp_revoke_due() -> dict:
    """Expire or revoke high-priority status that is due (beat, hourly); idempotent."""
    from provisioning.high_priority.services import hp_revoke_due as revoke_due

    return revoke_due()
