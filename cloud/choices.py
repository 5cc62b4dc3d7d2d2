"""States and kinds of the infrastructure inventory."""

from django.db import models


class NodeState(models.TextChoices):
    """Node lifecycle (in the spirit of OpenStack Ironic); legal moves are in cloud.transitions."""

    ENROLLED = "enrolled", "Enrolled"
    VALIDATING = "validating", "Validating (burn-in)"
    AVAILABLE = "available", "Available"
    ALLOCATED = "allocated", "Allocated (bare metal)"
    IN_SERVICE = "in_service", "In service (shared host)"
    RELEASING = "releasing", "Releasing (cleaning)"
    SUSPECT = "suspect", "Suspect (missed heartbeats)"
    QUARANTINED = "quarantined", "Quarantined"
    REFERENCE_UNAVAILABLE = "reference_unavailable", "Reference values unavailable"
    FAULTY = "faulty", "Faulty"
    REPAIR = "repair", "In repair"
    MAINTENANCE = "maintenance", "Maintenance (operator hold)"


class GPUState(models.TextChoices):
    """Lifecycle of one GPU of a shared host; a bare-metal node's GPUs follow their node."""

    AVAILABLE = "available", "Available"
    ALLOCATED = "allocated", "Allocated"
    SCRUBBING = "scrubbing", "Scrubbing"
    QUARANTINED = "quarantined", "Quarantined"


class Health(models.TextChoices):
    """Last known health of a node or GPU."""

    HEALTHY = "healthy", "Healthy"
    DEGRADED = "degraded", "Degraded"
    FAILED = "failed", "Failed"
    UNKNOWN = "unknown", "Unknown"


class NodePool(models.TextChoices):
    """Bare-metal nodes are sold whole; shared hosts run several tenants' VMs and containers."""

    BARE_METAL = "bare_metal", "Bare metal"
    SHARED = "shared", "Shared host"


class SwitchTier(models.TextChoices):
    """Tiers of an InfiniBand fat tree; each node hangs off one leaf."""

    LEAF = "leaf", "Leaf"
    SPINE = "spine", "Spine"
    CORE = "core", "Core"


class OfferingKind(models.TextChoices):
    """What is sold: whole servers, passthrough VMs, or containers (whole or fractional GPUs)."""

    BARE_METAL = "bare_metal", "Bare metal"
    VM = "vm", "Virtual machine"
    CONTAINER = "container", "Container"


class IsolationMode(models.TextChoices):
    """How an offering keeps tenants' GPU memory apart."""

    EXCLUSIVE = "exclusive", "Exclusive GPU"
    MIG = "mig", "MIG partition"
    SHARED = "shared", "Shared with a memory cap"
    TIME_SLICED = "time_sliced", "Time-sliced with a memory cap"


class TimeSliceClass(models.TextChoices):
    """
    How long each task's turn on a time-sliced GPU lasts. Tasks of different classes never share
    a GPU: a training task's long slices would stall a real-time task's requests.
    """

    REALTIME = "realtime", "Real-time inference (~1 ms slices)"
    BATCH = "batch", "Batch inference (~5 ms slices)"
    TRAINING = "training", "Training (~50 ms slices)"


# The slice length each class asks of the driver, in milliseconds.
TIME_SLICE_MS = {TimeSliceClass.REALTIME: 1, TimeSliceClass.BATCH: 5, TimeSliceClass.TRAINING: 50}
# At most this many tasks share one time-sliced GPU.
MAX_TASKS_PER_GPU = 8
# A time-sliced task's memory cap is this share of its stretch of the GPU's memory: the rest is
# headroom for its CUDA context and the driver's state when the GPU switches between tasks.
TIME_SLICE_MEMORY_SHARE = 0.9


def pool_of(kind: str) -> str:
    """The node pool that sells an offering of ``kind``: bare-metal servers, or shared hosts for VMs and containers."""
    return NodePool.BARE_METAL if kind == OfferingKind.BARE_METAL else NodePool.SHARED
