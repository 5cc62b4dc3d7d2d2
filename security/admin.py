from django.contrib import admin

from .models import AuditEvent


@admin.register(AuditEvent)
class AuditEventAdmin(admin.ModelAdmin):
    """Read-only: the trail is written by services only."""

    list_display = ["occurred_at", "action", "actor_email", "target_type", "target_id", "tenant_id"]
    list_filter = ["action"]
    search_fields = ["target_id", "actor_email", "request_id"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
