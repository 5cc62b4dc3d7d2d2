"""The vocabulary of inference endpoints."""

from django.db import models


class EndpointState(models.TextChoices):
    ACTIVE = "active", "Active"
    DELETING = "deleting", "Deleting"  # its replicas drain and are released
    DELETED = "deleted", "Deleted"


class ReplicaState(models.TextChoices):
    STARTING = "starting", "Starting"  # its reservation is queued, placed or provisioning
    SERVING = "serving", "Serving"  # active and healthy: the load balancer sends it traffic
    DRAINING = "draining", "Draining"  # out of the load balancer; released once the drain is over
    GONE = "gone", "Gone"


LIVE_REPLICA_STATES = (ReplicaState.STARTING, ReplicaState.SERVING)


class Decision(models.TextChoices):
    SCALE_OUT = "scale_out", "Scale out"
    SCALE_IN = "scale_in", "Scale in"
    HOLD = "hold", "Held"  # a change was wanted and something held it (cooldown, the maximum)
    BURST = "burst", "Burst"  # new replicas go to the next region
    RETURN = "return", "Return"  # the home region has room again: replicas come back
    REPLACE = "replace", "Replace"  # a replica failed or was lost
