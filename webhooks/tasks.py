"""Webhooks' Celery tasks: thin wrappers around webhooks.delivery."""

from celery import shared_task

from webhooks import delivery


@shared_task(name="webhooks.dispatch")
def dispatch() -> int:
    """The events written since the last run, fanned out to their endpoints' deliveries (the beat's every few s)."""
    made = 0
    for _ in range(20):  # 20 batches a run at most: the next run goes on
        events, deliveries = delivery.dispatch()
        made += deliveries
        if events < delivery.BATCH:
            break
    return made


@shared_task(name="webhooks.deliver")
def deliver(delivery_id: str) -> str:
    return delivery.deliver(delivery_id)


@shared_task(name="webhooks.sweep")
def sweep() -> int:
    """Queue an attempt at every due delivery (retries after their backoff, and any whose queueing was lost)."""
    due = delivery.due()
    for pk in due:
        deliver.delay(str(pk))
    return len(due)


@shared_task(name="webhooks.prune")
def prune() -> int:
    return delivery.prune()

