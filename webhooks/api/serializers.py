"""The webhooks API's shapes."""

from __future__ import annotations

from rest_framework import serializers

from web.api.base import BoundedListField, StrictSerializer
from webhooks.models import WebhookAttempt, WebhookDelivery, WebhookEndpoint


class WebhookEndpointSerializer(serializers.ModelSerializer):
    class Meta:
        model = WebhookEndpoint
        fields = ["id", "url", "description", "event_types", "is_active", "disabled_reason", "failures_in_a_row",
                  "previous_secret_until", "created_at", "updated_at"]
        read_only_fields = fields


class WebhookEndpointWithSecretSerializer(WebhookEndpointSerializer):
    secret = serializers.SerializerMethodField(help_text="Shown only now: keep it to verify signatures.")

    class Meta(WebhookEndpointSerializer.Meta):
        fields = [*WebhookEndpointSerializer.Meta.fields, "secret"]
        read_only_fields = fields

    def get_secret(self, endpoint) -> str:
        return self.context["secret"]


class WebhookEndpointWriteSerializer(StrictSerializer):
    url = serializers.URLField(max_length=500, help_text="https; deliveries never go to private addresses.")
    event_types = BoundedListField(child=serializers.CharField(max_length=64), max_length=32,
                                   help_text='E.g. ["reservation.state", "budget.*"]; ["*"] for every type.')
    description = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")
    is_active = serializers.BooleanField(required=False, help_text="On again after it was disabled.")


class WebhookAttemptSerializer(serializers.ModelSerializer):
    class Meta:
        model = WebhookAttempt
        fields = ["at", "status_code", "error", "duration_ms"]
        read_only_fields = fields


class WebhookDeliverySerializer(serializers.ModelSerializer):
    endpoint = serializers.UUIDField(source="endpoint_id", read_only=True)
    attempt_log = WebhookAttemptSerializer(many=True, read_only=True)

    class Meta:
        model = WebhookDelivery
        fields = ["id", "endpoint", "event_id", "event_type", "state", "attempts", "next_attempt_at",
                  "last_status_code", "last_error", "delivered_at", "created_at", "payload", "attempt_log"]
        read_only_fields = fields
