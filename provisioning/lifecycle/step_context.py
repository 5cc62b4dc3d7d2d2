"""
What a step works with: its Context (the operation, its drivers, its reservation and
instances), the Target a driver is given for a node, NodeFault (a driver error naming its node),
the Step itself, and the keys an instance is given.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from provisioning.drivers import DriverError, Drivers, Target


class NodeFault(Exception):
    """
    A driver call for one node failed; ``cause`` says how, ``transient`` whether to retry.
    ``held``: the node (or its GPUs) is held already -- attestation quarantined it -- so the
    failure handlers must not mark it faulty on top. ``blame``: whether the node is at fault.
    """
    def __init__(self, node, cause: DriverError | str, *, transient: bool | None = None, held: bool = False,
                 blame: bool = True):
        self.node = node
        self.cause = str(cause)
        self.held = held
        # False: the node is fine, the request is not (the tenant's network cannot be made, say):
        # its instances are cleaned like the others and the node goes back to the pool.
        self.blame = blame and not held
        self.transient = getattr(cause, "transient", False) if transient is None else transient
        self.wait_s = getattr(cause, "wait_s", None)  # NotYet: not a failure, ask again then
        super().__init__(f"{node.hostname}: {self.cause}")


@dataclass
class Context:
    operation: object
    drivers: Drivers
    reservation: object | None = None
    instances: list = field(default_factory=list)  # the instances this operation works on
    node: object | None = None  # a validation's node

    def each(self, act: Callable) -> None:
        """Run ``act(instance, target)`` for every instance; a driver error names its node."""
        for instance in self.instances:
            self.on(instance.node, lambda target, instance=instance: act(instance, target))

    def on(self, node, act: Callable):
        try:
            return act(target_of(node))
        except DriverError as exc:
            raise NodeFault(node, exc) from exc


def target_of(node) -> Target:
    return Target(node_id=str(node.pk), hostname=node.hostname, bmc_address=node.bmc_address,
                  bmc_username=node.bmc_username, bmc_password=node.bmc_password)


@dataclass(frozen=True)
class Step:
    """
    ``run`` acts for one operation. ``run_many``, where a step has one, acts for a batch of
    operations at once (one fabric call for them all); anything it raises sends the batch back
    to ``run``, one operation at a time, to find whose fault it is (steps are idempotent).
    """
    name: str
    run: Callable[[Context], None]
    run_many: Callable[[list[Context]], None] | None = None


def authorized_keys(reservation) -> str:
    """
    The authorized_keys an instance of ``reservation`` gets: the key pasted into it, then its saved
    keys as they are now (a key removed since is no longer there), each once, one per line.
    """
    lines = [reservation.ssh_public_key.strip()] if reservation.ssh_public_key.strip() else []
    lines += [key.authorized_keys_line for key in reservation.ssh_keys.order_by("name", "created_at")]
    return "\n".join(dict.fromkeys(lines))


def keys_of(reservation) -> list[str]:
    return [line for line in authorized_keys(reservation).splitlines() if line]
