"""Serializers of the inventory and catalogue API. Node BMC credentials are never serialized."""

from decimal import Decimal

from drf_spectacular.utils import PolymorphicProxySerializer, extend_schema_field
from rest_framework import serializers

from cloud.choices import NodePool, SwitchTier
from cloud.guids import normal_guid
from cloud.models import GPU, Fabric, GPUModel, HCAPort, Node, Offering, Region
from cloud.pricing import list_prices
from web.api.base import SLUG_PATTERN as SLUG
from web.api.base import BoundedListField, StrictIntegerField, StrictModelSerializer, StrictSerializer


class RegionSerializer(StrictModelSerializer):
    slug = serializers.RegexField(SLUG, max_length=50)

    class Meta:
        model = Region
        fields = ["id", "slug", "name", "is_active", "created_at"]
        read_only_fields = ["id", "created_at"]
        validators = []


class GPUModelSerializer(StrictModelSerializer):
    slug = serializers.RegexField(SLUG, max_length=50)
    supports_mig = serializers.BooleanField(read_only=True)

    class Meta:
        model = GPUModel
        fields = ["id", "slug", "name", "vendor", "memory_gib", "memory_bandwidth_tbs", "fp16_tflops", "fp8_tflops",
                  "mig_max_instances", "supports_mig", "tdp_watts"]
        read_only_fields = ["id"]
        validators = []


class RegionAvailabilitySerializer(serializers.Serializer):
    region = serializers.CharField()
    units = serializers.IntegerField(help_text="Instances of this offering that could start now.")
    gpus = serializers.IntegerField(help_text="Available GPUs of the offering's model behind those units.")


class OfferingSerializer(StrictModelSerializer):
    slug = serializers.RegexField(SLUG, max_length=50)
    gpu_model = serializers.SlugRelatedField(slug_field="slug", queryset=GPUModel.objects.all())
    reserved_price_per_gpu_hour = serializers.DecimalField(max_digits=8, decimal_places=4, read_only=True)
    availability = serializers.SerializerMethodField()
    prices = serializers.SerializerMethodField(
        help_text="Per term, what a GPU-hour costs now where a region has no price of its own (the price book; "
                  "spot: its floor, the market's price is per region at /spot-prices/).")

    class Meta:
        model = Offering
        fields = ["id", "slug", "name", "kind", "gpu_model", "gpus_per_unit", "slots_per_gpu", "isolation_mode",
                  "time_slice_class", "confidential", "price_per_gpu_hour", "reserved_discount_pct",
                  "reserved_price_per_gpu_hour",
                  "spot_available", "spot_floor_price", "is_active", "no_show_grace_minutes", "no_show_warning_minutes",
                  "release_grace_minutes", "availability", "prices", "created_at"]
        read_only_fields = ["id", "created_at"]
        validators = []

    @extend_schema_field({"type": "object", "additionalProperties": {"type": "string", "format": "decimal"}})
    def get_prices(self, offering) -> dict:
        known = self.context.get("prices", {}).get(offering.pk)
        return {term: f"{price:.4f}" for term, price in (known or list_prices(offering)).items()}

    @extend_schema_field(RegionAvailabilitySerializer(many=True))
    def get_availability(self, offering):
        by_region = self.context.get("availability", {}).get(offering.pk, {})
        return [{"region": region, **counts} for region, counts in by_region.items()]


class FabricSerializer(StrictModelSerializer):
    region = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    leaf_count = serializers.IntegerField(read_only=True)
    spine_count = serializers.IntegerField(read_only=True)
    node_count = serializers.IntegerField(read_only=True)

    class Meta:
        model = Fabric
        fields = ["id", "region", "name", "slug", "pkey_min", "pkey_max", "leaf_count", "spine_count", "node_count",
                  "created_at"]
        read_only_fields = fields


class NodeSerializer(StrictModelSerializer):
    region = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    fabric = serializers.UUIDField(source="fabric_id", read_only=True)
    leaf = serializers.CharField(source="leaf.name", read_only=True)
    gpu_count = serializers.IntegerField(read_only=True)

    class Meta:
        model = Node
        # bmc_password is deliberately absent: credentials never leave through the API.
        fields = ["id", "hostname", "region", "fabric", "leaf", "pool", "is_spare", "cvm_host", "gpu_cc_mode",
                  "confidential", "bmc_address", "cpu_cores", "ram_gib", "nvme_tb", "state", "state_reason",
                  "state_changed_at", "health", "gpu_count", "created_at"]
        read_only_fields = fields


HOSTNAME = r"^(?=.{1,253}$)[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?)*$"
PCI_BUS_ID = r"^[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[01][0-9a-fA-F]\.[0-7]$"


class GPUEnrolSerializer(StrictSerializer):
    index = StrictIntegerField(min_value=0, max_value=15)
    uuid = serializers.RegexField(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$", max_length=64)
    serial = serializers.RegexField(r"^[A-Za-z0-9-]{1,64}$", max_length=64)
    pci_bus_id = serializers.RegexField(PCI_BUS_ID, max_length=32)


class NodeEnrolSerializer(StrictSerializer):
    """A new node and its GPUs as the vendor's inventory lists them; validation starts at once."""
    hostname = serializers.RegexField(HOSTNAME, max_length=253)
    region = serializers.SlugRelatedField(slug_field="slug", queryset=Region.objects.all())
    fabric = serializers.RegexField(SLUG, max_length=50)
    leaf = serializers.CharField(max_length=100)
    pool = serializers.ChoiceField(choices=NodePool.choices)
    is_spare = serializers.BooleanField(default=False)
    cvm_host = serializers.BooleanField(default=False, help_text="The CPUs run confidential VMs (SEV-SNP or TDX).")
    bmc_address = serializers.URLField(max_length=255)
    bmc_username = serializers.CharField(max_length=64, allow_blank=True, default="")
    bmc_password = serializers.CharField(max_length=256, allow_blank=True, default="", write_only=True,
                                         trim_whitespace=False)
    cpu_cores = StrictIntegerField(min_value=1, max_value=4096)
    ram_gib = StrictIntegerField(min_value=1, max_value=1_048_576)
    nvme_tb = serializers.DecimalField(max_digits=6, decimal_places=2, min_value=Decimal("0"))
    gpu_model = serializers.SlugRelatedField(slug_field="slug", queryset=GPUModel.objects.all())
    gpus = GPUEnrolSerializer(many=True, allow_empty=False, max_length=16)
    # The node's InfiniBand port GUIDs in port order (IB-VPC membership is per port GUID).
    ib_port_guids = BoundedListField(child=serializers.CharField(max_length=18), min_length=1, max_length=16)
    # Their physical functions' PCI addresses, in the same order: a shared host's VMs get its
    # virtual functions passed through by address.
    ib_port_pci_bus_ids = BoundedListField(child=serializers.RegexField(PCI_BUS_ID, max_length=32), required=False,
                                           max_length=16, help_text="The ports' PCI addresses, in port order (needed "
                                           "for VMs on a shared host).")

    def validate_ib_port_guids(self, guids):
        try:
            normal = [normal_guid(guid) for guid in guids]
        except ValueError as exc:
            raise serializers.ValidationError(str(exc)) from None
        if len(set(normal)) != len(normal):
            raise serializers.ValidationError("Two ports have the same GUID.")
        taken = HCAPort.objects.filter(guid__in=normal).values_list("guid", flat=True).first()
        if taken:
            raise serializers.ValidationError(f"Port GUID {taken} belongs to another node.")
        return normal

    def validate(self, attrs):
        fabric = Fabric.objects.filter(region=attrs["region"], slug=attrs["fabric"]).first()
        if fabric is None:
            raise serializers.ValidationError({"fabric": f"Region {attrs['region'].slug} has no fabric "
                                                         f"'{attrs['fabric']}'."})
        leaf = fabric.switches.filter(name=attrs["leaf"], tier=SwitchTier.LEAF).first()
        if leaf is None:
            raise serializers.ValidationError({"leaf": f"Fabric {fabric.slug} has no leaf switch '{attrs['leaf']}'."})
        attrs["fabric"], attrs["leaf"] = fabric, leaf
        addresses = attrs.get("ib_port_pci_bus_ids")
        if addresses is not None and len(addresses) != len(attrs["ib_port_guids"]):
            raise serializers.ValidationError({"ib_port_pci_bus_ids": (
                f"Give one per port: {len(attrs['ib_port_guids'])} GUIDs, {len(addresses)} addresses.")})
        for field in ("index", "uuid", "serial", "pci_bus_id"):
            values = [gpu[field] for gpu in attrs["gpus"]]
            if len(set(values)) != len(values):
                raise serializers.ValidationError({"gpus": f"Two GPUs have the same {field}."})
        if Node.objects.filter(hostname=attrs["hostname"]).exists():
            raise serializers.ValidationError({"hostname": "A node with this hostname is enrolled already."})
        taken = GPU.objects.filter(uuid__in=[g["uuid"] for g in attrs["gpus"]]).values_list("uuid", flat=True)
        if taken:
            raise serializers.ValidationError({"gpus": f"GPU {taken[0]} is enrolled in another node."})
        return attrs


class NodeMaintenanceSerializer(StrictSerializer):
    reason = serializers.CharField(max_length=500)


class GPUSerializer(StrictModelSerializer):
    node = serializers.CharField(source="node.hostname", read_only=True)
    model = serializers.SlugRelatedField(slug_field="slug", read_only=True)

    class Meta:
        model = GPU
        fields = ["id", "node", "index", "uuid", "serial", "pci_bus_id", "model", "memory_mib", "state", "health",
                  "mig_enabled", "nvlink_domain", "pcie_switch", "numa_node"]
        read_only_fields = fields


#
# GPU telemetry (cloud.telemetry)
#


class TelemetryQuerySerializer(serializers.Serializer):
    """The query of a telemetry read: raw samples or 1-minute/1-hour buckets, since a time."""
    period = serializers.ChoiceField(choices=["raw", "1m", "1h"], default="1m",
                                     help_text="raw (one sample per heartbeat), 1m or 1h buckets.")
    since = serializers.DateTimeField(required=False,
                                      help_text="ISO 8601; by default the last 10 min (raw), 1 h (1m) or 7 days (1h).")

    def validate_since(self, value):
        from datetime import timedelta

        from django.utils import timezone

        if value > timezone.now() + timedelta(minutes=1):
            raise serializers.ValidationError("since is in the future.", code="future")
        return value


class TelemetryLatestSerializer(serializers.Serializer):
    """The latest sample of a GPU; a reading the GPU (or, out of band, the BMC) does not give is null."""
    sampled_at = serializers.DateTimeField()
    utilization_pct = serializers.IntegerField(allow_null=True)
    memory_used_mib = serializers.IntegerField(allow_null=True)
    memory_total_mib = serializers.IntegerField(allow_null=True)
    temperature_c = serializers.IntegerField(allow_null=True)
    power_w = serializers.FloatField(allow_null=True)
    ecc_corrected = serializers.IntegerField(allow_null=True, help_text="Cumulative since the driver loaded.")
    ecc_uncorrected = serializers.IntegerField(allow_null=True, help_text="Cumulative since the driver loaded.")
    processes = serializers.IntegerField(allow_null=True)
    nvlink_up = serializers.IntegerField(allow_null=True, help_text="NVLink links active (null: no NVLink).")
    nvlink_total = serializers.IntegerField(allow_null=True, help_text="NVLink links present (null: no NVLink).")
    time_slice_ms = serializers.IntegerField(allow_null=True, help_text="The compute time slice in force on a "
                                             "time-sliced GPU (null: the driver's default, or not readable).")
    xids = serializers.ListField(child=serializers.IntegerField(), help_text="XIDs since the sample before.")
    source = serializers.CharField(help_text="agent (NVML on the host) or bmc (out of band, a tenant holds the node).")


class RawPointSerializer(serializers.Serializer):
    """One raw sample."""
    at = serializers.DateTimeField()
    utilization_pct = serializers.IntegerField(allow_null=True)
    memory_used_mib = serializers.IntegerField(allow_null=True)
    temperature_c = serializers.IntegerField(allow_null=True)
    power_w = serializers.FloatField(allow_null=True)
    ecc_corrected = serializers.IntegerField(allow_null=True)
    ecc_uncorrected = serializers.IntegerField(allow_null=True)
    processes = serializers.IntegerField(allow_null=True, required=False)
    xids = serializers.ListField(child=serializers.IntegerField())


class RollupPointSerializer(serializers.Serializer):
    """One 1-minute or 1-hour bucket: means over the samples that had the reading, maxima, counts."""
    at = serializers.DateTimeField(help_text="The bucket's start.")
    samples = serializers.IntegerField()
    utilization_mean = serializers.FloatField(allow_null=True)
    utilization_std = serializers.FloatField(allow_null=True)
    utilization_max = serializers.IntegerField(allow_null=True)
    memory_used_max = serializers.IntegerField(allow_null=True)
    temperature_mean = serializers.FloatField(allow_null=True)
    temperature_max = serializers.IntegerField(allow_null=True)
    power_mean = serializers.FloatField(allow_null=True)
    power_max = serializers.FloatField(allow_null=True)
    ecc_uncorrected_max = serializers.IntegerField(allow_null=True)
    xid_count = serializers.IntegerField()
    idle_samples = serializers.IntegerField(help_text="Samples at 0 % utilization with no process.")


def telemetry_points(points: list[dict], period: str) -> list[dict]:
    serializer = RawPointSerializer if period == "raw" else RollupPointSerializer
    return serializer(points, many=True).data


TELEMETRY_POINTS = PolymorphicProxySerializer(
    component_name="TelemetryPoint", serializers=[RawPointSerializer, RollupPointSerializer],
    resource_type_field_name=None, many=True)


class GPUTelemetrySerializer(serializers.Serializer):
    gpu = serializers.UUIDField()
    period = serializers.CharField()
    since = serializers.DateTimeField()
    latest = TelemetryLatestSerializer(allow_null=True)
    series = serializers.SerializerMethodField()

    @extend_schema_field(TELEMETRY_POINTS)
    def get_series(self, data) -> list:
        return telemetry_points(data["series"], data["period"])
