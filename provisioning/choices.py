"""States and terms of reservations, allocations and operations."""

from django.db import models


class ReservationState(models.TextChoices):
    """Reservation lifecycle; legal moves are in provisioning.transitions."""

    PENDING = "pending", "Pending"
    QUEUED = "queued", "Queued"
    SCHEDULED = "scheduled", "Scheduled"
    PROVISIONING = "provisioning", "Provisioning"
    ACTIVE = "active", "Active"
    RELEASING = "releasing", "Releasing"
    RELEASED = "released", "Released"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"
    PREEMPTED = "preempted", "Preempted"
    EXPIRED = "expired", "Expired"
    NO_SHOW = "no_show", "No-show"


class BillingTerm(models.TextChoices):
    ON_DEMAND = "on_demand", "On demand"
    RESERVED = "reserved", "Reserved term"
    SPOT = "spot", "Spot (preemptible)"


class EvictionPolicy(models.TextChoices):
    """How a spot reservation is evicted: soft gives a grace period first, hard stops it at once."""

    SOFT = "soft", "Soft (grace period)"
    HARD = "hard", "Hard (at once)"


class OperationKind(models.TextChoices):
    PLACE = "place", "Place"
    PROVISION = "provision", "Provision"
    RELEASE = "release", "Release"
    CANCEL = "cancel", "Cancel"
    EXTEND = "extend", "Extend"
    PREEMPT = "preempt", "Preempt"
    VALIDATE = "validate", "Validate a node"
    ATTEST = "attest", "Attest an idle node"


class OperationState(models.TextChoices):
    PENDING = "pending", "Pending"
    RUNNING = "running", "Running"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"  # stopped on purpose (a release, a cancel), not by a fault


class InstanceState(models.TextChoices):
    """What the tenant gets: a server, VM or container, from provisioning to released."""

    PROVISIONING = "provisioning", "Provisioning"
    ACTIVE = "active", "Active"
    RELEASING = "releasing", "Releasing"
    RELEASED = "released", "Released"
    FAILED = "failed", "Failed"


class StepState(models.TextChoices):
    RUNNING = "running", "Running"
    WAITING = "waiting", "Waiting for the hardware to answer"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed (will retry)"
    GAVE_UP = "gave_up", "Failed for good"


class VPCState(models.TextChoices):
    """IB-VPC lifecycle; legal moves are in provisioning.transitions."""

    PENDING = "pending", "Pending"  # created here, the partition not yet on the fabric
    ACTIVE = "active", "Active"
    DELETING = "deleting", "Deleting"  # asked to go; its P_Key stays taken until the fabric confirms
    DELETED = "deleted", "Deleted"
    ERROR = "error", "Error"
