"""Billing API: the price book (everyone reads it, platform admins add to it) and the tenant's metered usage."""

from __future__ import annotations

import django_filters
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.response import Response

from billing import prices
from billing.api import serializers as s
from billing.models import Price, UsageRollup
from web.api.base import PlatformViewSet, ReadMixin, TenantScopedViewSet


class PriceFilterSet(django_filters.FilterSet):
    offering = django_filters.CharFilter(field_name="offering__slug", max_length=50)
    region = django_filters.CharFilter(field_name="region__slug", max_length=50)

    class Meta:
        model = Price
        fields = ["offering", "region", "term"]


class PriceViewSet(ReadMixin, PlatformViewSet):
    """Prices per GPU-hour by offering, region and term, each from its start until the next."""

    policy = "prices"
    queryset = Price.objects.select_related("offering", "region")
    serializer_class = s.PriceSerializer
    filterset_class = PriceFilterSet
    ordering = ["offering__slug", "term", "-effective_from"]

    @extend_schema(request=s.PriceCreateSerializer, responses={201: s.PriceSerializer})
    def create(self, request):
        """Add a price from a moment in the future (platform admins); usage already recorded keeps its price."""
        data = s.PriceCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        price = prices.price_add(actor=self.principal, **data.validated_data)
        return Response(s.PriceSerializer(price).data, status=status.HTTP_201_CREATED)


class UsageFilterSet(django_filters.FilterSet):
    since = django_filters.IsoDateTimeFilter(field_name="starts_at", lookup_expr="gte")
    until = django_filters.IsoDateTimeFilter(field_name="starts_at", lookup_expr="lt")
    team = django_filters.UUIDFilter(field_name="team_id")

    class Meta:
        model = UsageRollup
        fields = ["period", "resource", "since", "until", "team"]


class UsageViewSet(ReadMixin, TenantScopedViewSet):
    """The tenant's metered usage, rated, per hour or day (``period``), team, resource, offering, region and term."""

    policy = "usage"
    queryset = UsageRollup.objects.select_related("offering", "storage_class", "region")
    serializer_class = s.UsageSerializer
    filterset_class = UsageFilterSet
    ordering = ["-starts_at", "resource"]
