"""Webhooks API: a tenant's admins register endpoints, rotate their secrets, read and resend deliveries."""

from __future__ import annotations

import django_filters
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.decorators import action
from rest_framework.response import Response

from web.api.base import ReadMixin, TenantScopedViewSet
from webhooks import catalogue, services
from webhooks.api import serializers as s
from webhooks.models import WebhookDelivery, WebhookEndpoint


class WebhookEndpointViewSet(ReadMixin, TenantScopedViewSet):
    """The tenant's webhook endpoints; the secret is shown once, at create and at rotation."""

    policy = "webhooks"
    queryset = WebhookEndpoint.objects.all()
    serializer_class = s.WebhookEndpointSerializer
    ordering = ["created_at"]

    @extend_schema(request=s.WebhookEndpointWriteSerializer, responses={201: s.WebhookEndpointWithSecretSerializer})
    def create(self, request):
        """Register an endpoint: https, public, sent the event types it names."""
        data = s.WebhookEndpointWriteSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        fields = {k: v for k, v in data.validated_data.items() if k != "is_active"}
        endpoint, secret = services.endpoint_create(actor=self.principal, **fields)
        return Response(s.WebhookEndpointWithSecretSerializer(endpoint, context={"secret": secret}).data,
                        status=status.HTTP_201_CREATED)

    @extend_schema(request=s.WebhookEndpointWriteSerializer, responses=s.WebhookEndpointSerializer)
    def partial_update(self, request, pk=None):
        """Change the URL, event types or description; ``is_active`` turns it off, or on again after it was disabled."""
        endpoint = self.get_object()
        data = s.WebhookEndpointWriteSerializer(data=request.data, partial=True)
        data.is_valid(raise_exception=True)
        endpoint = services.endpoint_update(actor=self.principal, endpoint=endpoint, **data.validated_data)
        return Response(s.WebhookEndpointSerializer(endpoint).data)

    def destroy(self, request, pk=None):
        services.endpoint_delete(actor=self.principal, endpoint=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(request=None, responses=s.WebhookEndpointWithSecretSerializer)
    @action(detail=True, methods=["post"], url_path="rotate-secret")
    def rotate_secret(self, request, pk=None):
        """A new secret (shown now); the old one still signs beside it for the overlap, then stops."""
        endpoint, secret = services.secret_rotate(actor=self.principal, endpoint=self.get_object())
        return Response(s.WebhookEndpointWithSecretSerializer(endpoint, context={"secret": secret}).data)

    @extend_schema(request=None, responses={202: s.WebhookDeliverySerializer})
    @action(detail=True, methods=["post"])
    def ping(self, request, pk=None):
        """Send the endpoint a ``webhook.ping`` event now, to check the receiver and its signature check."""
        delivery = services.ping(actor=self.principal, endpoint=self.get_object())
        return Response(s.WebhookDeliverySerializer(delivery).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=None, responses=dict)
    @action(detail=False, methods=["get"], url_path="event-types")
    def event_types(self, request):
        """The event families an endpoint may ask for, and what each covers."""
        return Response({"families": catalogue.FAMILIES, "examples": ["reservation.state", "reservation.*", "*"]})


class DeliveryFilterSet(django_filters.FilterSet):
    endpoint = django_filters.UUIDFilter(field_name="endpoint_id")
    state = django_filters.ChoiceFilter(choices=WebhookDelivery.State.choices)
    event_type = django_filters.CharFilter(max_length=64)

    class Meta:
        model = WebhookDelivery
        fields = ["endpoint", "state", "event_type"]


class WebhookDeliveryViewSet(ReadMixin, TenantScopedViewSet):
    """The deliveries of the tenant's endpoints, newest first, each with its attempts."""

    policy = "webhooks"
    queryset = WebhookDelivery.objects.prefetch_related("attempt_log")
    serializer_class = s.WebhookDeliverySerializer
    filterset_class = DeliveryFilterSet
    ordering = ["-created_at"]

    @extend_schema(request=None, responses={202: s.WebhookDeliverySerializer})
    @action(detail=True, methods=["post"])
    def redeliver(self, request, pk=None):
        """Send it again now (same delivery id, so the receiver's idempotency check still holds)."""
        delivery = services.redeliver(actor=self.principal, delivery=self.get_object())
        return Response(s.WebhookDeliverySerializer(delivery).data, status=status.HTTP_202_ACCEPTED)
