from django.contrib import admin

from .models import GPU, Fabric, GPUModel, Node, Offering, Region, Switch


@admin.register(Region)
class RegionAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "is_active"]


@admin.register(GPUModel)
class GPUModelAdmin(admin.ModelAdmin):
    list_display = ["name", "memory_gib", "memory_bandwidth_tbs", "fp16_tflops", "fp8_tflops", "mig_max_instances"]


@admin.register(Fabric)
class FabricAdmin(admin.ModelAdmin):
    list_display = ["name", "region", "pkey_min", "pkey_max"]


@admin.register(Switch)
class SwitchAdmin(admin.ModelAdmin):
    list_display = ["name", "fabric", "tier", "pod"]
    list_filter = ["tier", "fabric"]


class GPUInline(admin.TabularInline):
    model = GPU
    extra = 0
    fields = ["index", "uuid", "serial", "pci_bus_id", "model", "state", "health"]
    readonly_fields = fields


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = ["hostname", "region", "pool", "state", "health", "is_spare"]
    list_filter = ["region", "pool", "state", "health", "is_spare"]
    search_fields = ["hostname"]
    exclude = ["bmc_password"]  # credentials never shown, not even to staff
    inlines = [GPUInline]


@admin.register(Offering)
class OfferingAdmin(admin.ModelAdmin):
    list_display = ["slug", "kind", "gpu_model", "gpus_per_unit", "price_per_gpu_hour", "is_active"]
    list_filter = ["kind", "is_active"]
