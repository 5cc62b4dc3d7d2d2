from rest_framework import serializers

from ..models import AuditEvent


class AuditEventSerializer(serializers.ModelSerializer):
    id = serializers.UUIDField(source="public_id", read_only=True)

    class Meta:
        model = AuditEvent
        fields = ["id", "occurred_at", "actor_id", "actor_email", "token_id", "tenant_id", "action", "target_type",
                  "target_id", "before", "after", "request_id"]
        read_only_fields = fields
