from django.contrib import admin

from core.admin import ReadOnlyAdmin
from security.models import AuditEvent, Incident


@admin.register(AuditEvent)
class AuditEventAdmin(ReadOnlyAdmin):
    """The trail is written by services only."""

    list_display = ["occurred_at", "action", "actor_email", "target_type", "target_id", "tenant_id"]
    list_filter = ["action"]
    search_fields = ["target_id", "actor_email", "request_id"]



@admin.register(Incident)
class IncidentAdmin(ReadOnlyAdmin):
    list_display = ["detected_at", "kind", "summary", "tenant_id", "resolved_at"]
    list_filter = ["kind"]
    search_fields = ["summary"]
