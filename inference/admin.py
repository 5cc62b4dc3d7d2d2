from django.contrib import admin

from inference.models import Endpoint, ScalingDecision


@admin.register(Endpoint)
class EndpointAdmin(admin.ModelAdmin):
    """Read-only: endpoints change through the inference services (the API and the console)."""

    list_display = ["name", "tenant", "offering", "desired_replicas", "bursting", "state", "created_at"]
    list_filter = ["state", "bursting"]
    readonly_fields = [f.name for f in Endpoint._meta.fields]

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(ScalingDecision)
class ScalingDecisionAdmin(admin.ModelAdmin):
    list_display = ["endpoint", "at", "action", "replicas_before", "replicas_after", "reason"]
    list_filter = ["action"]
    readonly_fields = [f.name for f in ScalingDecision._meta.fields]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False
