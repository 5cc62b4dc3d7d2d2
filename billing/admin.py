from django import forms
from django.contrib import admin
from django.utils import timezone

from billing.credits import credit_grant
from billing.models import Commitment, CreditGrant, Invoice, Price
from billing.prices import price_add


class PriceForm(forms.ModelForm):
    class Meta:
        model = Price
        fields = ["offering", "region", "term", "per_gpu_hour", "currency", "effective_from"]

    def clean_effective_from(self):
        value = self.cleaned_data["effective_from"]
        if value <= timezone.now():
            raise forms.ValidationError("A price starts in the future: what ran already keeps the price it ran at.")
        return value


@admin.register(Price)
class PriceAdmin(admin.ModelAdmin):
    """Prices are added, never changed: a new price from a future moment replaces the one before it."""

    form = PriceForm

    list_display = ["offering", "region", "term", "per_gpu_hour", "currency", "effective_from"]
    list_filter = ["term", "region", "offering"]
    fields = ["offering", "region", "term", "per_gpu_hour", "currency", "effective_from"]

    def get_readonly_fields(self, request, obj=None):
        return self.fields if obj is not None else []

    def has_delete_permission(self, request, obj=None):
        return False

    def save_model(self, request, obj, form, change):
        """Through the service, which audits it (the form checked the start and that it is free)."""
        added = price_add(actor=request.user, offering=obj.offering, region=obj.region, term=obj.term,
                          per_gpu_hour=obj.per_gpu_hour, currency=obj.currency, effective_from=obj.effective_from)
        obj.pk = added.pk


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(Invoice)
class InvoiceAdmin(ReadOnlyAdmin):
    """Read-only: invoices close by themselves; a correction is a credit note (the API)."""

    list_display = ["number", "kind", "tenant", "period_start", "total", "currency", "finalized_at"]
    list_filter = ["kind", "state"]
    readonly_fields = [f.name for f in Invoice._meta.fields]


@admin.register(Commitment)
class CommitmentAdmin(ReadOnlyAdmin):
    """Read-only: tenants commit through the API or the console; a started one is binding."""

    list_display = ["name", "tenant", "gpus", "offering", "region", "starts_at", "ends_at", "rate", "cancelled_at"]
    list_filter = ["region", "offering"]
    readonly_fields = [f.name for f in Commitment._meta.fields]


@admin.register(CreditGrant)
class CreditGrantAdmin(admin.ModelAdmin):
    """Grants are added, never changed: a correction is a credit note or another grant."""

    list_display = ["tenant", "amount", "currency", "note", "granted_at"]
    fields = ["tenant", "amount", "note"]

    def get_readonly_fields(self, request, obj=None):
        return self.fields if obj is not None else []

    def has_delete_permission(self, request, obj=None):
        return False

    def save_model(self, request, obj, form, change):
        """Through the service, which audits it."""
        obj.pk = credit_grant(actor=request.user, tenant=obj.tenant, amount=obj.amount, note=obj.note,
                              at=timezone.now()).pk
