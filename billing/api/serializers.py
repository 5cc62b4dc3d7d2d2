"""The billing API's shapes."""

from __future__ import annotations

from decimal import Decimal

from rest_framework import serializers

from billing import budgets
from billing.models import Budget, Commitment, CreditGrant, Invoice, InvoiceLine, Price, SpotPrice, UsageRollup
from cloud.api.fields import CatalogueSlugField
from cloud.models import Offering, Region
from provisioning.choices import BillingTerm
from tenants.models import Team, Tenant
from web.api.base import BoundedListField, ScopedRelatedField, StrictIntegerField, StrictSerializer


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


class BudgetSerializer(serializers.ModelSerializer):
    team = serializers.UUIDField(source="team_id", read_only=True, allow_null=True)
    team_name = serializers.CharField(source="team.name", read_only=True, allow_null=True, default=None)
    spent = serializers.SerializerMethodField(help_text="This month's spend so far, as the ledger has rated it.")

    class Meta:
        model = Budget
        fields = ["id", "team", "team_name", "amount", "currency", "thresholds", "hard_stop", "spent", "updated_at"]
        read_only_fields = fields

    def get_spent(self, budget) -> str:
        known = self.context.get("spent")
        if known is not None:
            return f"{known.get((budget.tenant_id, budget.team_id), 0):.2f}"
        return f"{budgets.spent(budget.tenant_id, budget.team_id):.2f}"


class BudgetWriteSerializer(StrictSerializer):
    team = ScopedRelatedField(queryset=Team.objects.all(), required=False, allow_null=True,
                              help_text="Left out: the whole tenant's budget.")
    amount = serializers.DecimalField(max_digits=14, decimal_places=2, min_value=Decimal("0.01"),
                                      help_text='The month\'s amount as a decimal string, e.g. "5000.00".')
    thresholds = BoundedListField(child=StrictIntegerField(min_value=1, max_value=1000), max_length=10,
                                  default=list, help_text="Percents that notify once each a month, e.g. [50, 80, 100].")
    hard_stop = serializers.BooleanField(default=False, help_text="Refuse new work once the month's budget is spent.")

    def validate_amount(self, value):
        if isinstance(self.initial_data.get("amount"), float):
            raise serializers.ValidationError("Send money as a decimal string ('5000.00'), not a JSON number.",
                                              code="invalid")
        return value


class SpotPriceSerializer(serializers.ModelSerializer):
    offering = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    region = serializers.SlugRelatedField(slug_field="slug", read_only=True)

    class Meta:
        model = SpotPrice
        fields = ["offering", "region", "at", "per_gpu_hour", "utilization"]
        read_only_fields = fields


class CommitmentSerializer(serializers.ModelSerializer):
    team = serializers.UUIDField(source="team_id", read_only=True, allow_null=True)
    team_name = serializers.CharField(source="team.name", read_only=True, allow_null=True, default=None)
    offering = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    region = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    reservation = serializers.UUIDField(source="reservation_id", read_only=True)
    reservation_state = serializers.CharField(source="reservation.state", read_only=True,
                                              help_text="Whether its capacity is placed (scheduled, active) or waits.")
    term_cost = serializers.SerializerMethodField(help_text="GPUs x hours of the term x rate: what the term costs.")

    class Meta:
        model = Commitment
        fields = ["id", "name", "team", "team_name", "offering", "region", "gpus", "months", "starts_at", "ends_at",
                  "rate", "currency", "term_cost", "reservation", "reservation_state", "cancelled_at", "created_at"]
        read_only_fields = fields

    def get_term_cost(self, commitment) -> str:
        hours = Decimal((commitment.ends_at - commitment.starts_at).total_seconds()) / 3600
        return f"{commitment.gpus * hours * commitment.rate:.2f}"


class CommitmentCreateSerializer(StrictSerializer):
    name = serializers.CharField(max_length=63)
    team = ScopedRelatedField(queryset=Team.objects.all(), required=False, allow_null=True,
                              help_text="Left out: the whole tenant's commitment.")
    offering = CatalogueSlugField(slug_field="slug", asked="offering on sale",
                                  queryset=Offering.objects.select_related("gpu_model").filter(is_active=True))
    region = CatalogueSlugField(slug_field="slug", asked="region in service",
                                queryset=Region.objects.filter(is_active=True))
    gpus = StrictIntegerField(min_value=1, max_value=100_000,
                              help_text="GPUs held (a multiple of the offering's unit).")
    months = StrictIntegerField(min_value=1, max_value=36, help_text="The term: 1 to 36 months.")
    starts_at = serializers.DateTimeField(required=False, allow_null=True, help_text="Left out: now.")
    ssh_public_key = serializers.CharField(required=False, allow_blank=True, max_length=16_384,
                                           help_text="For the instances on the committed capacity.")


class CreditGrantSerializer(serializers.ModelSerializer):
    tenant = serializers.SlugRelatedField(slug_field="slug", read_only=True)

    class Meta:
        model = CreditGrant
        fields = ["id", "tenant", "amount", "currency", "note", "granted_at"]
        read_only_fields = fields


class CreditGrantCreateSerializer(StrictSerializer):
    tenant = serializers.SlugRelatedField(slug_field="slug", queryset=Tenant.objects.all())
    amount = serializers.DecimalField(max_digits=14, decimal_places=2, min_value=Decimal("0.01"),
                                      help_text='As a decimal string, e.g. "10000.00".')
    note = serializers.CharField(max_length=200)

    def validate_amount(self, value):
        if isinstance(self.initial_data.get("amount"), float):
            raise serializers.ValidationError("Send money as a decimal string ('10000.00'), not a JSON number.",
                                              code="invalid")
        return value


class CreditBalanceSerializer(serializers.Serializer):
    granted = serializers.DecimalField(max_digits=16, decimal_places=2)
    taken = serializers.DecimalField(max_digits=16, decimal_places=2, help_text="By final invoices.")
    pending = serializers.DecimalField(max_digits=16, decimal_places=2,
                                       help_text="By the months not closed yet, as metered so far.")
    remaining = serializers.DecimalField(max_digits=16, decimal_places=2)
    currency = serializers.CharField()
