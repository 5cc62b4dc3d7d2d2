"""Serializers of the inventory and catalogue API. Node BMC credentials are never serialized."""

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from ..models import GPU, Fabric, GPUModel, Node, Offering, Region
from .base import SLUG_PATTERN as SLUG
from .base import StrictModelSerializer, StrictSerializer


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

    class Meta:
        model = Offering
        fields = ["id", "slug", "name", "kind", "gpu_model", "gpus_per_unit", "slots_per_gpu", "isolation_mode",
                  "price_per_gpu_hour", "reserved_discount_pct", "reserved_price_per_gpu_hour", "spot_available",
                  "spot_floor_price", "is_active", "availability", "created_at"]
        read_only_fields = ["id", "created_at"]
        validators = []

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
        fields = ["id", "hostname", "region", "fabric", "leaf", "pool", "is_spare", "bmc_address", "cpu_cores",
                  "ram_gib", "nvme_tb", "state", "state_reason", "state_changed_at", "health", "gpu_count",
                  "created_at"]
        read_only_fields = fields


class NodeMaintenanceSerializer(StrictSerializer):
    reason = serializers.CharField(max_length=500)


class GPUSerializer(StrictModelSerializer):
    node = serializers.CharField(source="node.hostname", read_only=True)
    model = serializers.SlugRelatedField(slug_field="slug", read_only=True)

    class Meta:
        model = GPU
        fields = ["id", "node", "index", "uuid", "serial", "pci_bus_id", "model", "memory_mib", "state", "health",
                  "mig_enabled"]
        read_only_fields = fields
