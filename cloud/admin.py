"""The inventory in the Django admin, read-only (core.admin.ReadOnlyAdmin)."""

from django.contrib import admin

from cloud.models import GPU, Fabric, GPUModel, HCAPort, Node, Offering, Region, Switch
from core.admin import ReadOnlyAdmin


@admin.register(Region)
class RegionAdmin(ReadOnlyAdmin):
    list_display = ["slug", "name", "is_active"]


@admin.register(GPUModel)
class GPUModelAdmin(ReadOnlyAdmin):
    list_display = ["name", "memory_gib", "memory_bandwidth_tbs", "fp16_tflops", "fp8_tflops", "mig_max_instances"]


@admin.register(Fabric)
class FabricAdmin(ReadOnlyAdmin):
    list_display = ["name", "region", "pkey_min", "pkey_max"]


@admin.register(Switch)
class SwitchAdmin(ReadOnlyAdmin):
    list_display = ["name", "fabric", "tier", "pod"]
    list_filter = ["tier", "fabric"]


class GPUInline(admin.TabularInline):
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    model = GPU
    extra = 0
    fields = ["index", "uuid", "serial", "pci_bus_id", "model", "state", "health"]


class HCAPortInline(GPUInline):
    model = HCAPort
    fields = ["index", "guid"]


@admin.register(Node)
class NodeAdmin(ReadOnlyAdmin):
    list_display = ["hostname", "region", "pool", "state", "health", "is_spare"]
    list_filter = ["region", "pool", "state", "health", "is_spare"]
    search_fields = ["hostname"]
    exclude = ["bmc_password"]  # credentials never shown, not even to staff
    inlines = [GPUInline, HCAPortInline]


@admin.register(Offering)
class OfferingAdmin(ReadOnlyAdmin):
    list_display = ["slug", "kind", "gpu_model", "gpus_per_unit", "price_per_gpu_hour", "is_active"]
    list_filter = ["kind", "is_active"]
