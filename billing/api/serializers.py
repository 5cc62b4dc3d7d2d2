"""The billing API's shapes."""

from __future__ import annotations

from decimal import Decimal

from rest_framework import serializers

from billing.models import Invoice, InvoiceLine, Price, UsageRollup
from cloud.models import Offering, Region
from provisioning.choices import BillingTerm
from web.api.base import StrictSerializer


class PriceSerializer(serializers.ModelSerializer):
    offering = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    region = serializers.SlugRelatedField(slug_field="slug", read_only=True, allow_null=True)

    class Meta:
        model = Price
        fields = ["id", "offering", "region", "term", "per_gpu_hour", "currency", "effective_from", "created_at"]
        read_only_fields = fields


class PriceCreateSerializer(StrictSerializer):
    offering = serializers.SlugRelatedField(slug_field="slug", queryset=Offering.objects.all())
    region = serializers.SlugRelatedField(slug_field="slug", queryset=Region.objects.all(), required=False,
                                          allow_null=True, help_text="Left out: every region without its own price.")
    term = serializers.ChoiceField(choices=BillingTerm.choices)
    per_gpu_hour = serializers.DecimalField(max_digits=12, decimal_places=6, min_value=0, coerce_to_string=True,
                                            help_text='A decimal string, e.g. "2.490000".')
    currency = serializers.RegexField(r"^[A-Z]{3}$", default="USD", help_text="ISO 4217, e.g. USD.")
    effective_from = serializers.DateTimeField(help_text="In the future: what ran already keeps its price.")

    def validate_per_gpu_hour(self, value):
        if isinstance(self.initial_data.get("per_gpu_hour"), float):
            raise serializers.ValidationError("Send money as a decimal string ('2.49'), not a JSON number.",
                                              code="invalid")
        return value


class UsageSerializer(serializers.ModelSerializer):
    offering = serializers.SlugRelatedField(slug_field="slug", read_only=True, allow_null=True)
    storage_class = serializers.SlugRelatedField(slug_field="slug", read_only=True, allow_null=True)
    region = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    team = serializers.UUIDField(source="team_id", read_only=True, allow_null=True)

    class Meta:
        model = UsageRollup
        fields = ["period", "starts_at", "team", "resource", "offering", "storage_class", "region", "term",
                  "quantity", "amount", "currency"]
        read_only_fields = fields


class InvoiceLineSerializer(serializers.ModelSerializer):
    class Meta:
        model = InvoiceLine
        fields = ["position", "kind", "team_name", "description", "region", "term", "quantity", "unit", "unit_price",
                  "amount"]
        read_only_fields = fields


class InvoiceSerializer(serializers.ModelSerializer):
    lines = InvoiceLineSerializer(many=True, read_only=True)
    corrects = serializers.CharField(source="corrects.number", read_only=True, allow_null=True, default=None)

    class Meta:
        model = Invoice
        fields = ["id", "number", "kind", "state", "period_start", "period_end", "currency", "subtotal", "credits",
                  "total", "finalized_at", "digest", "previous_digest", "corrects", "reason", "lines"]
        read_only_fields = fields


class CreditNoteSerializer(StrictSerializer):
    amount = serializers.DecimalField(max_digits=16, decimal_places=2, min_value=Decimal("0.01"),
                                      help_text='A decimal string, e.g. "12.50".')
    reason = serializers.CharField(max_length=400)
