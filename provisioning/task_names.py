"""
The provisioning tasks the services send, by name. ``provisioning.tasks`` sits on top of the
modules whose work its tasks run, so those modules send a task by its name (the name is the
contract with the queue) instead of importing the task object.
"""

from celery import current_app

OPERATION_STEP = "provisioning.operation_step"
RESERVATION_START_MANY = "provisioning.reservation_start_many"
VPC_SYNC = "provisioning.vpc_sync"


def send(name: str, args: tuple, **options) -> None:
    """Publish task ``name`` with ``args`` (``options`` as ``send_task`` takes them: countdown, producer)."""
    current_app.send_task(name, args=args, **options)
