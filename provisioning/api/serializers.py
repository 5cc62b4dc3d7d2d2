"""Reservation API: the create input (validated, then admitted by services) and the outputs."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.hazmat.primitives.serialization import load_ssh_public_key
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from cloud.api.fields import CatalogueSlugField
from cloud.api.serializers import TELEMETRY_POINTS, TelemetryLatestSerializer, telemetry_points
from cloud.choices import OfferingKind
from cloud.models import Image, Offering, Region
from core.errors import DomainError
from provisioning import cloud_init
from provisioning.admission import MAX_ENV_VARS, Ask, best_offering_for_spec, count_field, environment_check
from provisioning.choices import BillingTerm, EvictionPolicy
from provisioning.models import VPC, Instance, NodeValidation, Operation, Reservation, StepRun
from provisioning.scheduling.planner.topology import LINKS
from provisioning.scheduling.priority import URGENCY_LEVELS
from tenants.models import SSHKey, Team
from web.api.base import (
    BoundedDictField,
    BoundedListField,
    ScopedRelatedField,
    StrictFloatField,
    StrictIntegerField,
    StrictSerializer,
)

MAX_REGIONS = 8
MAX_KEY_LENGTH = 16_384
MAX_SSH_KEYS = 10


def validate_ssh_public_key(value: str) -> str:
    """An OpenSSH public key line; private keys and RSA under 2048 bits are refused."""
    value = value.strip()
    if "PRIVATE KEY" in value:
        raise serializers.ValidationError("This is a private key. Paste the public key (the .pub file) instead.",
                                          code="private_key")
    try:
        key = load_ssh_public_key(value.encode())
    except (ValueError, TypeError, UnsupportedAlgorithm) as exc:  # an unknown key type is not a key
        raise serializers.ValidationError(
            "Not an OpenSSH public key; expected a line like 'ssh-ed25519 AAAA... you@host'.", code="invalid"
        ) from exc
    if isinstance(key, rsa.RSAPublicKey) and key.key_size < 2048:
        raise serializers.ValidationError("RSA keys must have at least 2048 bits.", code="weak_key")
    return value


class SpecSerializer(StrictSerializer):
    """A logical GPU: the best-fitting model with at least this much compute and memory."""

    kind = serializers.ChoiceField(choices=OfferingKind.choices)
    min_fp16_tflops = StrictFloatField(min_value=0, max_value=1_000_000)
    min_memory_gib = StrictIntegerField(min_value=1, max_value=4096)


@extend_schema_field({"oneOf": [{"type": "number", "minimum": 0, "maximum": 1},
                               {"type": "string", "enum": list(URGENCY_LEVELS)}]})
class UrgencyField(serializers.Field):
    """A number in [0, 1] or a named level (low, normal, high, critical)."""

    default_error_messages = {"invalid": "Give a number from 0 to 1 or one of: " + ", ".join(URGENCY_LEVELS) + "."}

    def to_internal_value(self, data):
        if isinstance(data, str) and data in URGENCY_LEVELS:
            return URGENCY_LEVELS[data]
        if isinstance(data, bool) or not isinstance(data, (int, float)) or not 0 <= data <= 1:
            self.fail("invalid")
        return float(data)

    def to_representation(self, value):
        return value


class ReservationCreateSerializer(StrictSerializer):
    name = serializers.CharField(max_length=100)
    # With its GPU model: admission and the answer both name it.
    offering = CatalogueSlugField(slug_field="slug", required=False, asked="offering on sale",
                                  queryset=Offering.objects.select_related("gpu_model").filter(is_active=True))
    spec = SpecSerializer(required=False)
    gpus = StrictIntegerField(min_value=1, max_value=100_000, required=False,
                                    help_text="Whole GPUs, for VM and container offerings.")
    nodes = StrictIntegerField(min_value=1, max_value=20_000, required=False,
                                     help_text="Whole nodes, for bare-metal offerings.")
    slots = StrictIntegerField(min_value=1, max_value=100_000, required=False,
                                     help_text="GPU slots, for fractional container offerings.")
    regions = BoundedListField(child=CatalogueSlugField(slug_field="slug", asked="region in service",
                                                        queryset=Region.objects.filter(is_active=True)),
                               min_length=1, max_length=MAX_REGIONS, help_text="Acceptable regions, preferred first.")
    start = serializers.DateTimeField(required=False, allow_null=True,
                                      help_text="Start of an advance reservation; empty for as soon as possible.")
    duration_hours = StrictFloatField(min_value=0.01, max_value=24 * 366)
    billing_term = serializers.ChoiceField(choices=BillingTerm.choices, default=BillingTerm.ON_DEMAND)
    spot_max_price = serializers.DecimalField(max_digits=8, decimal_places=4, min_value=Decimal("0"),
                                              required=False, allow_null=True)
    eviction_policy = serializers.ChoiceField(choices=EvictionPolicy.choices, default=EvictionPolicy.SOFT)
    urgency = UrgencyField(default=0.5)
    team = ScopedRelatedField(queryset=Team.objects.all(), required=False, allow_null=True)
    vpc = ScopedRelatedField(queryset=VPC.objects.select_related("fabric__region"), required=False, allow_null=True,
                             help_text="The IB-VPC to join; your default VPC on the fabric it lands on if left out.")
    ssh_public_key = serializers.CharField(max_length=MAX_KEY_LENGTH, required=False, allow_blank=True,
                                           validators=[validate_ssh_public_key])
    public_ip = serializers.BooleanField(default=False, help_text="Give each instance a public address too.")
    image = ScopedRelatedField(queryset=Image.objects.all(), required=False, allow_null=True,
                               help_text="The image its instances boot (/images/); the default of the offering's "
                                         "kind if left out.")
    ssh_keys = BoundedListField(child=ScopedRelatedField(queryset=SSHKey.objects.all()), required=False,
                                max_length=MAX_SSH_KEYS, help_text="Ids of saved SSH keys (/ssh-keys/) its "
                                "instances get: your own and your tenant's shared ones.")
    user_data = serializers.CharField(required=False, allow_blank=True, trim_whitespace=False,
                                      help_text="cloud-init user-data for its instances: '#cloud-config' YAML or a "
                                                "script ('#!'), at most MERIDIAN_USER_DATA_MAX_BYTES (16 KiB).")

    environment = BoundedDictField(
        max_length=MAX_ENV_VARS, child=serializers.CharField(allow_blank=True, trim_whitespace=False), required=False,
        help_text="Environment variables of a container offering's instances (at most 64, 32 KiB), kept in a "
                  "Kubernetes Secret; the API shows their names only.")

    def validate_user_data(self, text):
        try:
            return cloud_init.user_data_check(text)
        except DomainError as exc:
            raise serializers.ValidationError(exc.detail["user_data"], code=exc.default_code) from None

    def validate_regions(self, regions):
        if len({region.pk for region in regions}) != len(regions):
            raise serializers.ValidationError("Name each region once.", code="duplicate")
        return regions

    def validate(self, attrs):
        if ("offering" in attrs) == ("spec" in attrs):
            raise serializers.ValidationError({"offering": ["Give an offering or a spec, not both or neither."]})
        offering = attrs.get("offering") or best_offering_for_spec(**attrs["spec"])
        counts = {name: attrs[name] for name in ("gpus", "nodes", "slots") if name in attrs}
        expected = count_field(offering)
        if list(counts) != [expected]:
            raise serializers.ValidationError(
                {expected: [f"{offering.slug} is sold by {expected}: give '{expected}' (and no other count)."]})
        units = counts[expected]
        if expected == "gpus":
            if units % offering.gpus_per_unit:
                raise serializers.ValidationError(
                    {"gpus": [f"{offering.slug} comes in units of {offering.gpus_per_unit} GPUs."]})
            units //= offering.gpus_per_unit
        attrs["ask"] = Ask(
            name=attrs["name"], offering=offering, units=units, regions=tuple(attrs["regions"]),
            duration=timedelta(hours=attrs["duration_hours"]), requested_start=attrs.get("start"),
            billing_term=attrs["billing_term"], spot_max_price=attrs.get("spot_max_price"),
            eviction_policy=attrs["eviction_policy"], urgency=attrs["urgency"],
            ssh_public_key=attrs.get("ssh_public_key", ""), spec=self.initial_data.get("spec"), vpc=attrs.get("vpc"),
            ssh_keys=tuple(dict.fromkeys(attrs.get("ssh_keys", []))), image=attrs.get("image"),
            public_ip=attrs["public_ip"], user_data=attrs.get("user_data", ""),
            environment=tuple(_environment(attrs.get("environment") or {}, offering).items()),
        )
        return attrs


def _environment(environment: dict, offering) -> dict:
    try:
        return environment_check(environment, offering)
    except DomainError as exc:
        raise serializers.ValidationError(exc.detail, code=exc.default_code) from None


class ExtendSerializer(StrictSerializer):
    hours = StrictFloatField(min_value=0.01, max_value=24 * 366)


# Platform admins' hand on the queue (provisioning.staff_actions): each with what the team is told.
STAFF_NOTE_MAX = 500


class PriorityAdjustSerializer(StrictSerializer):
    adjustment = StrictFloatField(min_value=-1, max_value=1, help_text="Added to the score after the factors' "
                                  "range: > 0 raises, < 0 lowers, 0 takes an adjustment back.")
    note = serializers.CharField(max_length=STAFF_NOTE_MAX, help_text="Why, for the reservation's team.")


class StaffNoteSerializer(StrictSerializer):
    note = serializers.CharField(max_length=STAFF_NOTE_MAX, help_text="Why, for the reservation's team.")


class StaffCancelSerializer(StrictSerializer):
    reason = serializers.CharField(max_length=STAFF_NOTE_MAX, help_text="Why, for the reservation's team.")


class ContactSerializer(StrictSerializer):
    message = serializers.CharField(max_length=STAFF_NOTE_MAX, help_text="The message the team is sent.")


class ReservationSerializer(serializers.ModelSerializer):
    offering = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    gpu_model = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    region = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    kind = serializers.CharField(source="offering.kind", read_only=True)
    duration_hours = serializers.SerializerMethodField()
    team = serializers.UUIDField(source="team_id", read_only=True, allow_null=True)
    vpc = serializers.UUIDField(source="vpc_id", read_only=True, allow_null=True)
    environment = serializers.SerializerMethodField(help_text="The names of its containers' environment variables "
                                                              "(their values stay in the Secret).")

    class Meta:
        model = Reservation
        fields = ["id", "name", "state", "state_reason", "offering", "kind", "gpu_model", "spec", "units", "gpus",
                  "regions", "region", "requested_start", "starts_at", "ends_at", "duration_hours", "billing_term",
                  "spot_max_price", "eviction_policy", "urgency", "team", "vpc", "score", "submitted_at",
                  "scheduled_at", "released_at", "image", "public_ip", "replacements", "replaced_at",
                  "replacement_reason", "environment"]
        read_only_fields = fields

    @extend_schema_field(serializers.ListField(child=serializers.CharField()))
    def get_environment(self, reservation) -> list[str]:
        return sorted(reservation.environment or {})

    @extend_schema_field(serializers.FloatField())
    def get_duration_hours(self, reservation) -> float:
        return round(reservation.duration.total_seconds() / 3600, 4)

    def to_representation(self, reservation):
        """
        The fields above, written out: building them for each serializer took four fifths of
        answering for one reservation (it is every create's answer, and every row of a list).
        Times and prices go through DRF's own fields; a test holds this to the generic output.
        """
        r = reservation
        return {
            "id": str(r.pk), "name": r.name, "state": r.state, "state_reason": r.state_reason,
            "offering": r.offering.slug, "kind": r.offering.kind, "gpu_model": r.gpu_model.slug, "spec": r.spec,
            "units": r.units, "gpus": r.gpus, "regions": r.regions,
            "region": r.region.slug if r.region_id is not None else None,
            "requested_start": _moment(r.requested_start), "starts_at": _moment(r.starts_at),
            "ends_at": _moment(r.ends_at), "duration_hours": self.get_duration_hours(r),
            "billing_term": r.billing_term,
            "spot_max_price": None if r.spot_max_price is None else _PRICE.to_representation(r.spot_max_price),
            "eviction_policy": r.eviction_policy, "urgency": r.urgency,
            "team": None if r.team_id is None else str(r.team_id), "vpc": None if r.vpc_id is None else str(r.vpc_id),
            "score": r.score, "submitted_at": _moment(r.submitted_at), "scheduled_at": _moment(r.scheduled_at),
            "released_at": _moment(r.released_at), "image": None if r.image_id is None else str(r.image_id),
            "public_ip": r.public_ip,
            "replacements": r.replacements,
            "replaced_at": _moment(r.replaced_at), "replacement_reason": r.replacement_reason,
            "environment": self.get_environment(r),
        }


# What ReservationSerializer.to_representation formats with, as its generic fields would.
_DATETIME = serializers.DateTimeField()
_price = Reservation._meta.get_field("spot_max_price")
_PRICE = serializers.DecimalField(max_digits=_price.max_digits, decimal_places=_price.decimal_places, read_only=True)


def _moment(value):
    return None if value is None else _DATETIME.to_representation(value)


class FactorSerializer(serializers.Serializer):
    name = serializers.CharField()
    value = serializers.FloatField()
    weight = serializers.FloatField()
    contribution = serializers.FloatField()


class ScoreSerializer(serializers.Serializer):
    total = serializers.FloatField()
    factors = FactorSerializer(many=True)
    adjustment = serializers.FloatField(help_text="Staff's raise (> 0) or cut (< 0), added to the factors' sum.")
    held = serializers.BooleanField(help_text="Whether staff hold it in the queue (it is not placed until let go).")
    queue_position = serializers.IntegerField(allow_null=True, help_text="1 = next; empty when not queued or held.")
    waiting_reason = serializers.CharField(allow_blank=True)
    estimated_start = serializers.DateTimeField(allow_null=True)


class ReceiptSerializer(serializers.Serializer):
    receipt = serializers.CharField(help_text="A JWT signed ES384 by Meridian (keys at /.well-known/jwks.json).")
    gpus = serializers.ListField(child=serializers.CharField(), help_text="The GPU UUIDs it covers.")


class ReservationGPUTelemetrySerializer(serializers.Serializer):
    """One of the reservation's GPUs: its latest sample and series, only from while it was the reservation's."""

    uuid = serializers.CharField()
    latest = TelemetryLatestSerializer(allow_null=True)
    series = serializers.SerializerMethodField()

    @extend_schema_field(TELEMETRY_POINTS)
    def get_series(self, data) -> list:
        return telemetry_points(data["series"], self.context["period"])


class ReservationTelemetrySerializer(serializers.Serializer):
    reservation = serializers.UUIDField()
    period = serializers.CharField()
    since = serializers.DateTimeField()
    gpus = serializers.SerializerMethodField()

    @extend_schema_field(ReservationGPUTelemetrySerializer(many=True))
    def get_gpus(self, data) -> list:
        return ReservationGPUTelemetrySerializer(data["gpus"], many=True, context={"period": data["period"]}).data


class UsageGPUSerializer(serializers.Serializer):
    """One GPU of the reservation: its latest sample and what the window's 1-minute rollups showed."""

    uuid = serializers.CharField()
    source = serializers.CharField(allow_null=True, help_text="agent (NVML) or bmc (out of band).")
    sampled_at = serializers.DateTimeField(allow_null=True)
    utilization_pct = serializers.IntegerField(allow_null=True)
    processes = serializers.IntegerField(allow_null=True, help_text="Empty on a GPU shared by slots.")
    power_w = serializers.FloatField(allow_null=True)
    idle_power_w = serializers.FloatField(help_text="At or below this draw the GPU counts as idle.")
    minutes = serializers.IntegerField(help_text="Minutes of the window with telemetry.")
    samples = serializers.IntegerField()
    idle_samples = serializers.IntegerField(help_text="Samples with 0 % utilization and no process.")
    idle_fraction = serializers.FloatField(allow_null=True)
    verdict = serializers.ChoiceField(choices=["idle", "used", "unknown"])


class UsageNodeSerializer(serializers.Serializer):
    """A bare-metal server's chassis draw as its BMC reports it."""

    name = serializers.CharField()
    read_at = serializers.DateTimeField()
    power_w = serializers.FloatField(allow_null=True)
    idle_power_w = serializers.FloatField()
    verdict = serializers.ChoiceField(choices=["idle", "used", "unknown"])


class UsageEvidenceSerializer(serializers.Serializer):
    since = serializers.DateTimeField()
    until = serializers.DateTimeField()
    minutes = serializers.IntegerField()
    needed_minutes = serializers.IntegerField(help_text="Minutes with telemetry needed to call a GPU idle.")
    verdict = serializers.ChoiceField(choices=["idle", "used", "unknown"],
                                      help_text="unknown: not enough telemetry; nothing is released then.")
    gpus = UsageGPUSerializer(many=True)
    nodes = UsageNodeSerializer(many=True)


class UsageWarningSerializer(serializers.Serializer):
    status = serializers.ChoiceField(choices=["pending", "cleared", "released"])
    warned_at = serializers.DateTimeField(allow_null=True)
    release_at = serializers.DateTimeField(allow_null=True)
    cleared_at = serializers.DateTimeField(allow_null=True)
    reason = serializers.CharField(allow_blank=True)
    evidence = UsageEvidenceSerializer(allow_null=True, help_text="As it was when the warning was sent.")


class UsagePolicySerializer(serializers.Serializer):
    no_show_grace_minutes = serializers.IntegerField()
    no_show_warning_minutes = serializers.IntegerField()
    release_grace_minutes = serializers.IntegerField()


class LateReleaseSerializer(serializers.Serializer):
    ended_at = serializers.DateTimeField()
    reclaim_at = serializers.DateTimeField()
    overdue_s = serializers.FloatField()


class ReservationUsageSerializer(serializers.Serializer):
    reservation = serializers.UUIDField()
    state = serializers.CharField()
    policy = UsagePolicySerializer()
    evidence = UsageEvidenceSerializer()
    warning = UsageWarningSerializer(allow_null=True)
    late_release = LateReleaseSerializer(allow_null=True)


class StepRunSerializer(serializers.ModelSerializer):
    class Meta:
        model = StepRun
        fields = ["name", "attempt", "state", "error", "started_at", "finished_at"]
        read_only_fields = fields


class NodeValidationSerializer(serializers.ModelSerializer):
    """One run of a node's acceptance checks: every check's value and bound, failures first."""

    class Meta:
        model = NodeValidation
        fields = ["id", "operation", "passed", "results", "measured_at"]
        read_only_fields = fields


class OperationSerializer(serializers.ModelSerializer):
    """An operation with its steps so far: every attempt, and the cause of every failed one."""

    steps = StepRunSerializer(many=True, read_only=True)

    class Meta:
        model = Operation
        fields = ["id", "reservation", "kind", "state", "step", "attempt", "progress", "error", "steps",
                  "created_at", "updated_at", "finished_at"]
        read_only_fields = fields


class HostKeySerializer(serializers.Serializer):
    type = serializers.CharField(help_text="ssh-ed25519, ecdsa-sha2-nistp256, ssh-rsa...")
    fingerprint = serializers.CharField(help_text="As ssh shows it on the first login: SHA256:...")


class ConsoleOutputSerializer(serializers.Serializer):
    output = serializers.CharField(help_text="The last bytes the instance printed on its serial console.")
    truncated = serializers.BooleanField(help_text="Whether earlier output was left out.")


class InstanceTopologySerializer(serializers.Serializer):
    gpus = serializers.ListField(child=serializers.IntegerField(), help_text="Its GPUs' indexes on the host.")
    link = serializers.ChoiceField(choices=LINKS, allow_null=True, help_text=(
        "The slowest link between its GPUs: nvlink (one NVLink or NVSwitch domain), pcie_switch (one PCIe switch), "
        "numa (one CPU's root complex), system (across CPUs); null for one GPU or where the host's topology is "
        "not known."))
    numa_node = serializers.IntegerField(allow_null=True, help_text=(
        "The host's NUMA node of its GPUs, where a VM's vCPUs and memory come from; null when they span several "
        "or it is not known."))


class InstanceSerializer(serializers.ModelSerializer):
    """What the tenant reaches: never the host a VM or container runs on (other tenants' neighbour)."""

    gpus = serializers.SerializerMethodField()
    topology = serializers.SerializerMethodField(help_text="Which GPUs of its host it was given and how they are "
                                                           "linked (null for instances made before it was recorded).")
    ipoib_addresses = serializers.SerializerMethodField()
    host_keys = serializers.SerializerMethodField(help_text="The SSH host keys it reported once booted: compare "
                                                            "with what ssh shows on the first login.")
    address = serializers.CharField(read_only=True, help_text="Its DNS name: <instance>.<tenant>.<region>.<zone>.")
    ssh_command = serializers.SerializerMethodField(help_text="How to log in, once it is active.")

    class Meta:
        model = Instance
        fields = ["id", "reservation", "index", "kind", "state", "name", "address", "private_ip", "public_ip",
                  "ipoib_addresses", "ssh_user", "ssh_command", "host_keys", "reported_at", "gpus", "topology",
                  "created_at", "updated_at"]
        read_only_fields = fields

    @extend_schema_field(InstanceTopologySerializer(allow_null=True))
    def get_topology(self, instance) -> dict | None:
        return instance.topology or None

    @extend_schema_field(serializers.ListField(child=serializers.IPAddressField()))
    def get_ipoib_addresses(self, instance) -> list[str]:
        """Its addresses on its IB-VPC's IPoIB subnet (one per port in the partition)."""
        live = getattr(instance, "live_memberships", None)
        if live is None:
            live = instance.memberships.filter(left_at__isnull=True)
        return sorted({m.address for m in live if m.address})

    @extend_schema_field(HostKeySerializer(many=True))
    def get_host_keys(self, instance) -> list[dict]:
        return [{"type": k["type"], "fingerprint": k["fingerprint"]} for k in instance.host_keys or []]

    def get_gpus(self, instance) -> int:
        return len(instance.devices)

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_ssh_command(self, instance) -> str | None:
        if instance.state != "active" or not instance.ssh_user:
            return None
        return f"ssh {instance.ssh_user}@{instance.public_ip or instance.address}"

