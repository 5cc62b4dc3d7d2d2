"""Inference's Celery tasks: thin wrappers around inference.scaling and inference.balancer."""

from celery import shared_task

from inference import balancer, scaling


@shared_task(name="inference.autoscale")
def autoscale() -> int:
    """Every endpoint: measure, decide, converge its replicas; then the balancer's configuration."""
    recorded = scaling.autoscale_all()
    balancer.sync()
    return recorded


@shared_task(name="inference.balancer_sync")
def balancer_sync() -> int:
    return balancer.sync().generation


def balancer_sync_soon() -> None:
    balancer_sync.delay()
