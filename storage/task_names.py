"""The storage tasks the services send, by name: the name is the contract with the queue (provisioning.task_names)."""

from celery import current_app

VOLUME_CONVERGE = "storage.volume_converge"
CHECKPOINT_MOVE = "storage.checkpoint_move"
SNAPSHOT_CONVERGE = "storage.snapshot_converge"


def send(name: str, args: tuple, **options) -> None:
    current_app.send_task(name, args=args, **options)
