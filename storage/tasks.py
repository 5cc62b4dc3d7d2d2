"""Storage's Celery tasks: thin wrappers around storage.steps."""

from celery import shared_task


@shared_task(name="storage.volume_converge", bind=True, max_retries=None)
def volume_converge(self, volume_id: str) -> str:
    """A volume's step; a transient backend error tries again with a growing delay."""
    from storage.steps import TryAgain
    from storage.steps import volume_converge as converge

    try:
        return converge(volume_id)
    except TryAgain as exc:
        raise self.retry(exc=exc, countdown=min(60, 2 ** min(self.request.retries, 6))) from exc


@shared_task(name="storage.snapshot_converge", bind=True, max_retries=None)
def snapshot_converge(self, snapshot_id: str) -> str:
    """A snapshot's step; a transient backend error tries again with a growing delay."""
    from storage.steps import TryAgain
    from storage.steps import snapshot_converge as converge

    try:
        return converge(snapshot_id)
    except TryAgain as exc:
        raise self.retry(exc=exc, countdown=min(60, 2 ** min(self.request.retries, 6))) from exc


@shared_task(name="storage.checkpoint_move", bind=True, max_retries=None)
def checkpoint_move(self, checkpoint_id: str) -> str:
    """A slice of a checkpoint's move between tiers; the rest is sent again, a transient error retried."""
    from storage.moves import TryAgain
    from storage.moves import checkpoint_move as move

    try:
        return move(checkpoint_id)
    except TryAgain as exc:
        raise self.retry(exc=exc, countdown=min(60, 2 ** min(self.request.retries, 6))) from exc


@shared_task(name="storage.checkpoints_tier")
def checkpoints_tier() -> dict:
    """Scan each checkpoint policy's volume and demote what it no longer keeps hot (storage.checkpoints)."""
    from storage.checkpoints import tier_pass

    return tier_pass()


@shared_task(name="storage.usage_sample")
def usage_sample() -> int:
    """Every tenant's billed storage, per team and class (storage.usage)."""
    from storage.usage import usage_sample as sample

    return sample()


@shared_task(name="storage.reconcile")
def storage_reconcile() -> dict:
    """Lost steps sent again, ended reservations' attachments detached, orphans removed (storage.steps)."""
    from storage.steps import storage_reconcile as reconcile

    return reconcile()
