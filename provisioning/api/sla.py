"""
SLA API: ``GET /api/v1/sla/?month=2026-11`` -- per tenant and month, availability of what it
reserved against the target, and the service credit owed (``provisioning.sla.accounting`` computes).

The resource is the tenant: a tenant principal lists (and reads) only its own, staff list every
tenant (``?tenant=<id>`` or ``?slug=`` narrows it) or read one at ``/sla/<tenant id>/``; another
tenant's is a 404. ``month`` defaults to the current one (figures up to now).
"""

from __future__ import annotations

import django_filters
from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.response import Response

from provisioning.sla.accounting import TenantSLA, parse_month, shown, sla_read
from tenants.models import Tenant
from web.api.base import ReadMixin, TenantScopedViewSet

MONTH_PARAMETER = OpenApiParameter(
    "month", str, required=False, pattern=r"^\d{4}-\d{2}$",
    description="Calendar month in UTC, YYYY-MM (default: this month, up to now).",
)


class MonthQuerySerializer(serializers.Serializer):
    """The ``month`` query parameter: YYYY-MM, from 2000-01 up to this month."""

    month = serializers.CharField(required=False, max_length=7, allow_blank=False)

    def validate_month(self, value):
        try:
            return parse_month(value, now=self.context["now"])
        except ValueError as exc:
            raise serializers.ValidationError(str(exc), code="invalid") from None


class SLAFilterSet(django_filters.FilterSet):
    tenant = django_filters.UUIDFilter(field_name="id")
    slug = django_filters.CharFilter(field_name="slug", max_length=50)

    class Meta:
        model = Tenant
        fields = ["tenant", "slug"]


class ReservationSLASerializer(serializers.Serializer):
    id = serializers.UUIDField(source="reservation_id")
    name = serializers.CharField()
    gpus = serializers.SerializerMethodField()
    reserved_gpu_minutes = serializers.SerializerMethodField()
    unavailable_gpu_minutes = serializers.SerializerMethodField()

    def get_gpus(self, obj) -> float:
        return float(shown(obj.gpus))

    def get_reserved_gpu_minutes(self, obj) -> float:
        return float(shown(obj.reserved_gpu_minutes, 2))

    def get_unavailable_gpu_minutes(self, obj) -> float:
        return float(shown(obj.unavailable_gpu_minutes, 2))


class IncidentSLASerializer(serializers.Serializer):
    """An incident as the month counts it (clipped to the month and the reservation's hold)."""

    id = serializers.UUIDField(source="outage.incident_id")
    kind = serializers.CharField(source="outage.kind")
    reservation = serializers.UUIDField(source="outage.reservation_id")
    gpus_affected = serializers.IntegerField(source="outage.gpus")
    started_at = serializers.DateTimeField()
    ended_at = serializers.DateTimeField()
    ongoing = serializers.BooleanField(source="outage.ongoing")
    gpu_minutes = serializers.SerializerMethodField(help_text="This incident's GPU-minutes counted alone.")

    def get_gpu_minutes(self, obj) -> float:
        return float(shown(obj.gpu_minutes, 2))


class SLASerializer(serializers.Serializer):
    """A tenant's month. Minutes are GPU-minutes; percentages are 0-100; money is in the price list's currency."""

    id = serializers.UUIDField(source="tenant.pk", help_text="The tenant.")
    tenant_name = serializers.CharField(source="tenant.name")
    tenant_slug = serializers.CharField(source="tenant.slug")
    month = serializers.SerializerMethodField()
    period_start = serializers.DateTimeField(source="figures.since")
    period_end = serializers.DateTimeField(source="figures.until", help_text="The month's end, or now while it runs.")
    complete = serializers.BooleanField(help_text="False while the month is still running.")
    whole_tenant = serializers.BooleanField(
        help_text="False when the caller sees only some teams' reservations (the figures cover those).")
    reserved_gpu_minutes = serializers.SerializerMethodField()
    unavailable_gpu_minutes = serializers.SerializerMethodField()
    availability_pct = serializers.SerializerMethodField()
    target_pct = serializers.SerializerMethodField()
    target_met = serializers.BooleanField(source="figures.met")
    spend = serializers.DecimalField(source="figures.spend", max_digits=16, decimal_places=2)
    credit_pct = serializers.DecimalField(source="figures.credit_percent", max_digits=5, decimal_places=2)
    credit = serializers.DecimalField(source="figures.credit", max_digits=16, decimal_places=2)
    reservations = ReservationSLASerializer(source="figures.reservations", many=True,
                                            help_text="Reservations that lost GPU-minutes, worst first.")
    incidents = IncidentSLASerializer(source="figures.outages", many=True)

    def get_month(self, obj: TenantSLA) -> str:
        return obj.month.strftime("%Y-%m")

    def get_reserved_gpu_minutes(self, obj: TenantSLA) -> float:
        return float(shown(obj.figures.reserved_gpu_minutes, 2))

    def get_unavailable_gpu_minutes(self, obj: TenantSLA) -> float:
        return float(shown(obj.figures.unavailable_gpu_minutes, 2))

    def get_availability_pct(self, obj: TenantSLA) -> float:
        return float(shown(obj.figures.availability))

    def get_target_pct(self, obj: TenantSLA) -> float:
        return float(shown(obj.figures.target))


@extend_schema(parameters=[MONTH_PARAMETER])
class SLAViewSet(ReadMixin, TenantScopedViewSet):
    """Availability and service credits per tenant and month: tenants read their own, staff every tenant's."""

    policy = "sla"
    queryset = Tenant.objects.all()
    serializer_class = SLASerializer
    filterset_class = SLAFilterSet
    ordering_fields = ["name", "slug"]
    ordering = ["name"]

    def _month(self, now):
        query = MonthQuerySerializer(data=self.request.query_params, context={"now": now})
        query.is_valid(raise_exception=True)
        return query.validated_data.get("month") or now.date().replace(day=1)

    def list(self, request, *args, **kwargs):
        now = timezone.now()
        month = self._month(now)  # a bad month is a 400 before anything is read
        page = self.paginate_queryset(self.filter_queryset(self.get_queryset()))
        rows = sla_read(principal=self.principal, tenants=page, month=month, now=now)
        return self.get_paginated_response(self.get_serializer(rows, many=True).data)

    def retrieve(self, request, *args, **kwargs):
        now = timezone.now()
        month = self._month(now)
        (row,) = sla_read(principal=self.principal, tenants=[self.get_object()], month=month, now=now)
        return Response(self.get_serializer(row).data)
