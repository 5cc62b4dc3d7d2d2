from django.contrib import admin

from storage.models import StorageClass, Volume


@admin.register(StorageClass)
class StorageClassAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "kind", "region", "price_per_gib_month", "min_gib", "max_gib", "is_active"]
    list_filter = ["kind", "region", "is_active"]


@admin.register(Volume)
class VolumeAdmin(admin.ModelAdmin):
    """Read-only: volumes change through the storage services (the API and the console)."""

    list_display = ["name", "tenant", "storage_class", "size_gib", "state", "created_at"]
    list_filter = ["state", "storage_class__kind"]
    readonly_fields = [f.name for f in Volume._meta.fields]

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
