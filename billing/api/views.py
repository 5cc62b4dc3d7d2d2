"""Billing API: the price book (everyone reads, platform admins add), the tenant's metered usage and invoices."""

from __future__ import annotations

from datetime import UTC, datetime

import django_filters
from django.http import HttpResponse
from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.decorators import action
from rest_framework.response import Response

from billing import budgets, commitments, credits, invoices, prices
from billing.api import serializers as s
from billing.models import Budget, Commitment, CreditGrant, Invoice, Price, SpotPrice, UsageRollup
from core.errors import Conflict, DomainError
from tenants.permissions import TENANT_REQUIRED
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


class InvoiceViewSet(ReadMixin, TenantScopedViewSet):
    """The tenant's final invoices and credit notes; ``current`` is the month's draft as it stands."""

    policy = "invoices"
    queryset = Invoice.objects.select_related("corrects").prefetch_related("lines")
    serializer_class = s.InvoiceSerializer
    filterset_fields = ["kind"]
    ordering = ["-period_start", "-sequence"]

    @extend_schema(parameters=[OpenApiParameter("month", str, description="YYYY-MM; this month when left out.")],
                   responses=s.InvoiceSerializer)
    @action(detail=False, methods=["get"])
    def current(self, request):
        """The month's invoice as the ledger has it now (a draft: nothing is numbered until the month closes)."""
        if self.principal.tenant is None:
            raise DomainError(TENANT_REQUIRED, code="tenant_required")
        month = request.query_params.get("month", "")
        try:
            start = datetime.strptime(month, "%Y-%m").replace(tzinfo=UTC) if month else timezone.now()
        except ValueError:
            raise DomainError({"month": ["Give the month as YYYY-MM, for example 2026-11."]}, code="invalid") from None
        built = invoices.draft(self.principal.tenant.pk, start)
        data = s.InvoiceSerializer(built.invoice).data
        data["id"] = None  # a draft is not stored: nothing to fetch by id until the month closes
        data["lines"] = s.InvoiceLineSerializer(built.lines, many=True).data
        return Response(data)

    @extend_schema(responses={(200, "text/csv"): str})
    @action(detail=True, methods=["get"])
    def csv(self, request, pk=None):
        """The invoice's lines as CSV (one row per line, then the totals)."""
        invoice = self.get_object()
        response = HttpResponse(invoices.invoice_csv(invoice), content_type="text/csv; charset=utf-8")
        response["Content-Disposition"] = f'attachment; filename="{invoice.number}.csv"'
        return response

    @extend_schema(request=s.CreditNoteSerializer, responses={201: s.InvoiceSerializer})
    @action(detail=True, methods=["post"], url_path="credit-notes")
    def credit_notes(self, request, pk=None):
        """Issue a credit note against this final invoice (platform admins): numbered in the same sequence."""
        invoice = self.get_object()
        data = s.CreditNoteSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        note = invoices.credit_note_issue(actor=self.principal, invoice=invoice, **data.validated_data)
        return Response(s.InvoiceSerializer(note).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses={409: None})
    def partial_update(self, request, pk=None):
        """A final invoice is never changed: 409, with what to do instead."""
        invoice = self.get_object()
        raise Conflict(f"{invoice.number} is final and never changes: a credit note corrects it.",
                       code="invoice_final")



class BudgetViewSet(ReadMixin, TenantScopedViewSet):
    """The tenant's and its teams' monthly budgets: thresholds that notify once, an optional hard stop."""

    policy = "budgets"
    queryset = Budget.objects.select_related("team")
    serializer_class = s.BudgetSerializer
    ordering = ["team__name"]

    def list(self, request, *args, **kwargs):
        """Each budget with this month's spend so far (read for all of them at once)."""
        page = self.paginate_queryset(self.filter_queryset(self.get_queryset()))
        spent = budgets.spent_by_owner({budget.tenant_id for budget in page})
        data = s.BudgetSerializer(page, many=True, context={**self.get_serializer_context(), "spent": spent}).data
        return self.get_paginated_response(data)

    @extend_schema(request=s.BudgetWriteSerializer, responses={201: s.BudgetSerializer})
    def create(self, request):
        """Set the tenant's budget (no team) or a team's (tenant admins); one each."""
        data = s.BudgetWriteSerializer(data=request.data, context=self.get_serializer_context())
        data.is_valid(raise_exception=True)
        budget = budgets.budget_set(actor=self.principal, **data.validated_data)
        return Response(s.BudgetSerializer(budget).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=s.BudgetWriteSerializer, responses=s.BudgetSerializer)
    def partial_update(self, request, pk=None):
        """Change the amount, thresholds or hard stop (the team stays)."""
        budget = self.get_object()
        data = s.BudgetWriteSerializer(data={"amount": str(budget.amount), "thresholds": budget.thresholds,
                                             "hard_stop": budget.hard_stop, **request.data},
                                       context=self.get_serializer_context())
        data.is_valid(raise_exception=True)
        attrs = {k: v for k, v in data.validated_data.items() if k != "team"}
        budget = budgets.budget_set(actor=self.principal, budget=budget, **attrs)
        return Response(s.BudgetSerializer(budget).data)

    def destroy(self, request, pk=None):
        """Remove the budget: no more notices, no hard stop."""
        budget = self.get_object()
        budgets.budget_delete(actor=self.principal, budget=budget)
        return Response(status=status.HTTP_204_NO_CONTENT)


class CommitmentViewSet(ReadMixin, TenantScopedViewSet):
    """The tenant's commitments: N GPUs of an offering in a region for 1-36 months at a fixed rate."""

    policy = "commitments"
    queryset = Commitment.objects.select_related("team", "offering", "region", "reservation")
    serializer_class = s.CommitmentSerializer
    ordering = ["-starts_at"]

    @extend_schema(request=s.CommitmentCreateSerializer, responses={201: s.CommitmentSerializer})
    def create(self, request):
        """Commit (tenant admins): its capacity is reserved at once, and billed from when it is placed."""
        data = s.CommitmentCreateSerializer(data=request.data, context=self.get_serializer_context())
        data.is_valid(raise_exception=True)
        commitment = commitments.commitment_create(actor=self.principal, **data.validated_data)
        return Response(s.CommitmentSerializer(commitment).data, status=status.HTTP_201_CREATED)

    def destroy(self, request, pk=None):
        """Cancel a commitment that has not started; a started one is binding (409 ``commitment_binding``)."""
        commitments.commitment_cancel(actor=self.principal, commitment=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)


class CreditViewSet(ReadMixin, TenantScopedViewSet):
    """Prepaid credit granted to the tenant (platform admins grant it); ``balance`` is what is left now."""

    policy = "credits"
    queryset = CreditGrant.objects.select_related("tenant")
    serializer_class = s.CreditGrantSerializer
    ordering = ["-granted_at"]

    @extend_schema(request=s.CreditGrantCreateSerializer, responses={201: s.CreditGrantSerializer})
    def create(self, request):
        """Grant a tenant prepaid credit from now (platform admins)."""
        data = s.CreditGrantCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        grant = credits.credit_grant(actor=self.principal, at=timezone.now(), **data.validated_data)
        return Response(s.CreditGrantSerializer(grant).data, status=status.HTTP_201_CREATED)

    @extend_schema(responses=s.CreditBalanceSerializer)
    @action(detail=False, methods=["get"])
    def balance(self, request):
        """Granted, taken by final invoices, drawn by this month so far, and what is left: a real-time burndown."""
        if self.principal.tenant is None:
            raise DomainError(TENANT_REQUIRED, code="tenant_required")
        left = invoices.credit_balance(self.principal.tenant.pk)
        return Response(s.CreditBalanceSerializer({"granted": left.granted, "taken": left.taken,
                                                   "pending": left.pending, "remaining": left.remaining,
                                                   "currency": left.currency}).data)


class SpotPriceFilterSet(django_filters.FilterSet):
    offering = django_filters.CharFilter(field_name="offering__slug", max_length=50)
    region = django_filters.CharFilter(field_name="region__slug", max_length=50)
    since = django_filters.IsoDateTimeFilter(field_name="at", lookup_expr="gte")

    class Meta:
        model = SpotPrice
        fields = ["offering", "region", "since"]


class SpotPriceViewSet(ReadMixin, PlatformViewSet):
    """The spot market's prices, newest first: each from its time until the next, with the utilization behind it."""

    policy = "spot-prices"
    queryset = SpotPrice.objects.select_related("offering", "region")
    serializer_class = s.SpotPriceSerializer
    filterset_class = SpotPriceFilterSet
    ordering = ["-at"]
