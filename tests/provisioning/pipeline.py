"""
Run the lifecycle here, in order, instead of through Celery: what the services enqueue (steps,
starts) is collected and run by ``Steps.run`` until nothing is left. Fault tests use it to
stop between a driver call and its commit.
"""

import uuid
from collections import deque

from provisioning.lifecycle import runner
from provisioning.lifecycle import start as starting
from provisioning.models import Reservation

SSH_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGn0E1yq1j3pUzY6v7K5QkqQjL0Ck8gqX8m3FZqgYkWd alice@laptop"


class Steps:
    def __init__(self):
        self.queue: deque = deque()
        self.ran: list[tuple[str, str, str]] = []  # (operation kind, step, outcome)
        self.countdowns: list[float] = []  # of retries
        self.together = False

    def enqueue(self, operation, step, countdown=0):
        """What dispatching.enqueue does, with the message kept here: a new dispatch token, then the step."""
        from provisioning.models import Operation

        if countdown:
            self.countdowns.append(countdown)
        batch = operation if isinstance(operation, list) else [operation]
        ids, token = [str(getattr(one, "pk", one)) for one in batch], uuid.uuid4().hex[:16]
        Operation.objects.filter(pk__in=ids).update(dispatch=token)
        self.queue.append(("step", ids if isinstance(operation, list) else ids[0], step, token))

    def when_due(self, reservations):
        """Started one by one, or -- ``together`` set -- in one message, as a scheduler cycle sends them."""
        if self.together:
            self.queue.append(("starts", [str(reservation.pk) for reservation in reservations], None, None))
            return
        for reservation in reservations:
            self.queue.append(("start", str(reservation.pk), None, None))

    def run(self, limit: int = 500, *, redeliver: type[BaseException] | None = None, settle: bool = True) -> list:
        """
        Run until nothing is left (or ``limit`` tasks, when ``settle`` is off); a task that raises
        ``redeliver`` is delivered again (a lost worker).
        """
        from provisioning.models import Operation

        for _ in range(limit):
            if not self.queue:
                return self.ran
            what, pk, step, token = task = self.queue.popleft()
            try:
                if what == "start":
                    starting.reservation_provision_start(pk)
                    continue
                if what == "starts":
                    starting.reservations_start(pk)
                    continue
                outcomes = runner.operation_run_step(pk, step, token)
                if not isinstance(outcomes, dict):
                    outcomes = {pk: outcomes}
                kinds = dict(Operation.objects.filter(pk__in=list(outcomes)).values_list("pk", "kind"))
                self.ran += [(kinds.get(uuid.UUID(key)), step, outcome) for key, outcome in outcomes.items()]
            except BaseException as exc:
                if redeliver is None or not isinstance(exc, redeliver):
                    raise
                self.queue.appendleft(task)
        if settle:
            raise AssertionError(f"the lifecycle did not settle in {limit} tasks: {self.ran[-10:]}")
        return self.ran


def reservation(pk) -> Reservation:
    return Reservation.objects.select_related("offering").get(pk=pk)


def reserve_on_small_fleet(world, *, kind: str = "vm", name: str = "job", hours: float = 2, **extra) -> str:
    """
    A fresh four-node fleet and one reservation of ``kind`` on it (a one-GPU VM, or a whole
    8-GPU server), made through the API as t1's member; its id. ``steps.run()`` then starts it.
    """
    from tests.provisioning.factories import offering
    from tests.world import small_fleet

    Reservation.objects.all().delete()  # the world's own queued work would compete
    small_fleet(4)
    amount = {"nodes": 1} if kind == "bare_metal" else {"gpus": 1}
    response = world.client("t1_member").post("/api/v1/reservations/", {
        "name": name, "offering": offering(kind, 8 if kind == "bare_metal" else 1).slug, "regions": ["us-east-1"],
        "duration_hours": hours, "ssh_public_key": SSH_KEY, **amount, **extra}, format="json")
    assert response.status_code == 201, response.json()
    return response.json()["id"]


def reserve_vm(world, persona: str = "t1_owner", gpus: int = 1, **extra) -> Reservation:
    """A VM reservation of ``gpus`` (1, or a whole 8-GPU host) in us-east-1, made through the API as ``persona``."""
    from tests.world import vm_offering

    body = {"name": "job", "offering": vm_offering(gpus if gpus == 8 else 1).slug, "gpus": gpus,
            "regions": ["us-east-1"], "duration_hours": 2, **extra}
    response = world.client(persona).post("/api/v1/reservations/", body, format="json")
    assert response.status_code == 201, response.content
    return Reservation.objects.get(pk=response.json()["id"])
