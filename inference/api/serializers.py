"""The inference endpoints API's shapes."""

from __future__ import annotations

from rest_framework import serializers

from cloud.choices import TimeSliceClass
from cloud.models import Image
from inference.balancer import endpoint_url
from inference.endpoints import SHARE_KINDS
from inference.models import Endpoint, Replica, ScalingDecision
from provisioning.admission import MAX_ENV_VARS
from tenants.models import Team
from web.api.base import BoundedDictField, BoundedListField, ScopedRelatedField, StrictIntegerField, StrictSerializer

SCALING = ("min_replicas", "max_replicas", "target_utilization", "scale_in_below", "window_seconds",
           "scale_out_stabilization_seconds", "scale_in_stabilization_seconds", "scale_out_cooldown_seconds",
           "scale_in_cooldown_seconds", "spare_pct", "spare_above", "burst_utilization", "burst_after_seconds")
LIMITS = {"min_replicas": (1, 64), "max_replicas": (1, 64), "target_utilization": (1, 100),
          "scale_in_below": (1, 99), "window_seconds": (1, 3600), "scale_out_stabilization_seconds": (0, 3600),
          "scale_in_stabilization_seconds": (0, 3600), "scale_out_cooldown_seconds": (0, 3600),
          "scale_in_cooldown_seconds": (0, 3600), "spare_pct": (0, 100), "spare_above": (0, 64),
          "burst_utilization": (1, 100), "burst_after_seconds": (0, 86400)}


class ShareSerializer(StrictSerializer):
    gpu_model = serializers.SlugField(max_length=50, help_text="A GPU model's slug, e.g. h100-80gb-sxm.")
    kind = serializers.ChoiceField(choices=SHARE_KINDS, default="gpu",
                                   help_text="gpu (whole), mig (a MIG slice), slot (memory-capped) or time_slice.")
    fraction = StrictIntegerField(min_value=1, max_value=64, default=1, help_text="1/fraction of a GPU.")
    time_slice_class = serializers.ChoiceField(choices=TimeSliceClass.choices, required=False, allow_blank=True,
                                               default="", help_text="time_slice shares: realtime, batch or training.")


class ReplicaSerializer(serializers.ModelSerializer):
    reservation = serializers.UUIDField(source="reservation_id", read_only=True)
    name = serializers.CharField(source="reservation.name", read_only=True)
    region = serializers.SerializerMethodField()
    reservation_state = serializers.CharField(source="reservation.state", read_only=True)

    class Meta:
        model = Replica
        fields = ["id", "reservation", "name", "state", "state_reason", "region", "burst", "reservation_state",
                  "created_at", "serving_since", "draining_since", "gone_at"]
        read_only_fields = fields

    def get_region(self, replica) -> str | None:
        region = replica.reservation.region
        return region.slug if region else None


class ScalingDecisionSerializer(serializers.ModelSerializer):
    class Meta:
        model = ScalingDecision
        fields = ["id", "at", "action", "replicas_before", "replicas_after", "reason", "inputs"]
        read_only_fields = fields


class EndpointSerializer(serializers.ModelSerializer):
    team = serializers.UUIDField(source="team_id", read_only=True, allow_null=True)
    offering = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    image = serializers.UUIDField(source="image_id", read_only=True, allow_null=True)
    url = serializers.SerializerMethodField(help_text="Its one stable URL (the load balancer's host name for it).")
    replicas = serializers.SerializerMethodField(help_text="Live replicas by state.")

    class Meta:
        model = Endpoint
        fields = ["id", "name", "url", "team", "offering", "image", "port", "health_path", "regions", "state",
                  "desired_replicas", "bursting", "home_hot_since", "last_scaled_at", "replicas", *SCALING,
                  "created_at"]
        read_only_fields = fields

    def get_url(self, endpoint) -> str:
        return endpoint_url(endpoint)

    def get_replicas(self, endpoint) -> dict:
        counts: dict = {}
        for replica in endpoint.replicas.all():
            counts[replica.state] = counts.get(replica.state, 0) + 1
        return counts


# The scaling knobs, each optional (the endpoint's defaults otherwise), as one base of both writes.
ScalingSerializer = type("ScalingSerializer", (StrictSerializer,), {
    name: StrictIntegerField(min_value=lo, max_value=hi, required=False) for name, (lo, hi) in LIMITS.items()})


class EndpointWriteSerializer(ScalingSerializer):
    name = serializers.RegexField(r"^[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?$", max_length=40,
                                  help_text="Lowercase letters, digits and dashes: part of its URL.")
    share = ShareSerializer(help_text="What each replica holds.")
    regions = BoundedListField(child=serializers.SlugField(max_length=50), max_length=8, min_length=1,
                               help_text="Region slugs, home first; replicas burst into the next ones.")
    team = ScopedRelatedField(queryset=Team.objects.all(), required=False, allow_null=True)
    image = ScopedRelatedField(queryset=Image.objects.all(), required=False, allow_null=True)
    port = StrictIntegerField(min_value=1, max_value=65535, required=False, default=8000)
    health_path = serializers.CharField(max_length=200, required=False, default="/healthz",
                                        help_text="A path on each replica's port, 2xx when it can serve.")
    environment = BoundedDictField(max_length=MAX_ENV_VARS, child=serializers.CharField(allow_blank=True,
                                                                                        trim_whitespace=False),
                                   required=False, default=dict,
                                   help_text="Environment of each replica's container (the API shows none of it back).")


class EndpointUpdateSerializer(ScalingSerializer):
    regions = BoundedListField(child=serializers.SlugField(max_length=50), max_length=8, min_length=1,
                               required=False)
    health_path = serializers.CharField(max_length=200, required=False)
