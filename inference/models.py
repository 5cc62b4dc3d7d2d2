"""
Inference endpoints (docs/inference.md): a team's service of replicas behind one stable URL,
scaled on the replicas' GPU utilization. Each replica is a reservation the endpoint owns.
"""

from __future__ import annotations

import uuid

from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import F, Q

from inference.choices import Decision, EndpointState, ReplicaState
from tenants.scoping import TeamOwnedModel, TenantOwnedModel

PERCENT = [MinValueValidator(1), MaxValueValidator(100)]


class Endpoint(TeamOwnedModel):
    """
    An image served by ``min_replicas``..``max_replicas`` replicas of an offering (a whole GPU, a MIG
    slice, a memory-capped slot or a time slice each), in ``regions`` in order of preference.
    Scaling follows Kubernetes' HPA: the replicas' mean GPU utilization over ``window_seconds``
    against ``target_utilization`` (out) and ``scale_in_below`` (in), each direction with its
    stabilization window and cooldown; spares on top (``spare_pct``, at least one spare above
    ``spare_above`` replicas). When the home region stays above ``burst_utilization`` for
    ``burst_after_seconds``, new replicas go to the next region; they come back when it has room.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.SlugField(max_length=40, help_text="Part of its URL: lowercase letters, digits and dashes.")
    offering = models.ForeignKey("cloud.Offering", on_delete=models.PROTECT, related_name="+")
    image = models.ForeignKey("cloud.Image", null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    port = models.PositiveIntegerField(default=8000, validators=[MinValueValidator(1), MaxValueValidator(65535)])
    health_path = models.CharField(max_length=200, default="/healthz",
                                   help_text="A path on each replica's port, answered 2xx when it can serve.")
    regions = models.JSONField(help_text="Region slugs in order of preference; the first is home.")
    environment = models.JSONField(default=dict, blank=True)
    min_replicas = models.PositiveSmallIntegerField(default=1, validators=[MaxValueValidator(64)])
    max_replicas = models.PositiveSmallIntegerField(default=4, validators=[MinValueValidator(1), MaxValueValidator(64)])
    target_utilization = models.PositiveSmallIntegerField(default=70, validators=PERCENT)
    scale_in_below = models.PositiveSmallIntegerField(default=40, validators=PERCENT)
    window_seconds = models.PositiveIntegerField(default=10, validators=[MinValueValidator(1),
                                                                         MaxValueValidator(3600)])
    scale_out_stabilization_seconds = models.PositiveIntegerField(default=0, validators=[MaxValueValidator(3600)])
    scale_in_stabilization_seconds = models.PositiveIntegerField(default=300, validators=[MaxValueValidator(3600)])
    scale_out_cooldown_seconds = models.PositiveIntegerField(default=30, validators=[MaxValueValidator(3600)])
    scale_in_cooldown_seconds = models.PositiveIntegerField(default=120, validators=[MaxValueValidator(3600)])
    spare_pct = models.PositiveSmallIntegerField(default=5, validators=[MaxValueValidator(100)])
    spare_above = models.PositiveSmallIntegerField(default=4, help_text="At least one spare replica when more than "
                                                                         "this many are needed.")
    burst_utilization = models.PositiveSmallIntegerField(default=85, validators=PERCENT)
    burst_after_seconds = models.PositiveIntegerField(default=300, validators=[MaxValueValidator(86400)])
    state = models.CharField(max_length=12, choices=EndpointState.choices, default=EndpointState.ACTIVE)
    desired_replicas = models.PositiveSmallIntegerField(default=1)
    # The autoscaler's recent recommendations [[unix time, replicas], ...] for its stabilization windows.
    recommendations = models.JSONField(default=list, blank=True)
    last_scaled_at = models.DateTimeField(null=True, blank=True)
    home_hot_since = models.DateTimeField(null=True, blank=True, help_text="Since when its home region has been "
                                                                           "above the burst mark.")
    bursting = models.BooleanField(default=False)
    # Demo and benchmarks: a synthetic load in replica-equivalents, {"base": x, "peak": y, "period_s": s}.
    synthetic_load = models.JSONField(null=True, blank=True)
    created_by = models.ForeignKey("tenants.User", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name"], condition=~Q(state=EndpointState.DELETED),
                                    name="endpoint_name_unique_per_tenant"),
            models.CheckConstraint(condition=Q(min_replicas__lte=F("max_replicas")), name="endpoint_min_le_max"),
            models.CheckConstraint(condition=Q(scale_in_below__lt=F("target_utilization")),
                                   name="endpoint_scale_in_below_target"),
        ]

    def __str__(self):
        return self.name

    @property
    def home(self) -> str:
        return self.regions[0]


class Replica(TenantOwnedModel):
    """One replica: the reservation it runs as, and where it stands in the load balancer."""

    team_path = "endpoint__team"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    endpoint = models.ForeignKey(Endpoint, on_delete=models.CASCADE, related_name="replicas")
    reservation = models.OneToOneField("provisioning.Reservation", on_delete=models.PROTECT, related_name="replica")
    state = models.CharField(max_length=12, choices=ReplicaState.choices, default=ReplicaState.STARTING)
    state_reason = models.CharField(max_length=300, blank=True)
    burst = models.BooleanField(default=False, help_text="Placed away from home while the home region was hot.")
    created_at = models.DateTimeField(auto_now_add=True)
    serving_since = models.DateTimeField(null=True, blank=True)
    draining_since = models.DateTimeField(null=True, blank=True)
    gone_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["created_at"]
        indexes = [models.Index(fields=["endpoint", "state"], name="replica_endpoint_state_idx")]

    def __str__(self):
        return f"{self.endpoint.name}/{self.reservation_id} ({self.state})"


class ScalingDecision(TenantOwnedModel):
    """What the autoscaler decided for an endpoint, with the figures it decided on."""

    team_path = "endpoint__team"

    id = models.BigAutoField(primary_key=True)
    endpoint = models.ForeignKey(Endpoint, on_delete=models.CASCADE, related_name="decisions")
    at = models.DateTimeField()
    action = models.CharField(max_length=12, choices=Decision.choices)
    replicas_before = models.PositiveSmallIntegerField()
    replicas_after = models.PositiveSmallIntegerField()
    reason = models.CharField(max_length=300)
    inputs = models.JSONField(default=dict)

    class Meta:
        ordering = ["-at", "-id"]
        indexes = [models.Index(fields=["endpoint", "at"], name="scaling_decision_endpoint_idx")]


class BalancerState(models.Model):
    """The load balancer's configuration as last written and applied (one row)."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    generation = models.PositiveBigIntegerField(default=0)
    digest = models.CharField(max_length=64, blank=True)
    applied_at = models.DateTimeField(null=True, blank=True, help_text="When this configuration was applied.")
    # The last time the configuration in force was found to be the one the database asks for: a
    # replica drained before then is out of the balancer, and may be released.
    checked_at = models.DateTimeField(null=True, blank=True)
    error = models.CharField(max_length=500, blank=True)

    def __str__(self):
        return f"balancer configuration {self.generation}"
