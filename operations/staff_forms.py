"""
Forms of the staff console (operations.staff_views): they parse and check what a person typed; the
services decide. Lookups go through the querysets the view passes in, already scoped to its
principal, so a form cannot reach a row its page could not show.
"""

from __future__ import annotations

from django import forms
from django.core.exceptions import ValidationError

from cloud.choices import NodeState
from tenants.choices import QuotaResource

QUOTA_LIMIT_MAX = 1_000_000  # as the API's QuotaSerializer


class FleetFilterForm(forms.Form):
    """The fleet page's filters (GET); an unknown value is a form error and filters nothing."""

    region = forms.ChoiceField(label="Region", required=False)
    state = forms.ChoiceField(label="State", required=False, choices=[("", "All states"), *NodeState.choices])

    def __init__(self, data=None, *, regions):
        super().__init__(data, label_suffix="")
        self.fields["region"].choices = [("", "All regions"), *[(r.slug, r.name) for r in regions]]


class MaintenanceForm(forms.Form):
    """Why a node is held (kept with the node and in the audit trail)."""

    reason = forms.CharField(label="Reason", max_length=500, strip=True)


class QuotaSetForm(forms.Form):
    """
    Set (create or change) a tenant's or a team's quota. The tenant and the team are picked from
    lists (their slugs are the values, as the API takes them); the GPU models offered are those
    the fleet has.
    """

    tenant = forms.SlugField(label="Tenant", max_length=50, widget=forms.Select)
    team = forms.SlugField(label="Team", max_length=50, required=False, widget=forms.Select,
                           help_text="One of that tenant's teams, or the whole tenant.")
    resource = forms.ChoiceField(label="Resource", choices=QuotaResource.choices)
    gpu_model = forms.ChoiceField(label="GPU model", required=False,
                                  help_text="GPU quotas only; all models counts every GPU together.")
    limit = forms.IntegerField(label="Limit", min_value=0, max_value=QUOTA_LIMIT_MAX)

    def __init__(self, data=None, *, tenants, teams, gpu_models, **kwargs):
        super().__init__(data, label_suffix="", **kwargs)
        self.tenants, self.teams = tenants, teams
        tenant_list = list(tenants.order_by("name", "slug"))
        self.fields["tenant"].widget.choices = [("", "Choose a tenant"), *[(t.slug, t.name) for t in tenant_list]]
        names = {t.pk: t.name for t in tenant_list}
        grouped: dict = {}
        for team in teams.filter(tenant__in=tenant_list).order_by("tenant__name", "name"):
            grouped.setdefault(names[team.tenant_id], []).append((team.slug, team.name))
        self.fields["team"].widget.choices = [("", "Whole tenant"), *grouped.items()]
        self.gpu_models = {m.slug: m for m in gpu_models}
        self.fields["gpu_model"].choices = [("", "All models"), *[(m.slug, m.name) for m in gpu_models]]

    def clean_tenant(self):
        slug = self.cleaned_data["tenant"]
        tenant = self.tenants.filter(slug=slug).first()
        if tenant is None:
            raise ValidationError("Choose one of the tenants listed.", code="not_found")
        return tenant

    def clean_gpu_model(self):
        return self.gpu_models.get(self.cleaned_data["gpu_model"])

    def clean(self):
        cleaned = super().clean()
        tenant, slug = cleaned.get("tenant"), cleaned.get("team")
        if tenant is not None and slug:
            team = self.teams.filter(tenant=tenant, slug=slug).first()
            if team is None:
                self.add_error("team", ValidationError(f"{tenant.slug} has no team '{slug}'.", code="not_found"))
            cleaned["team"] = team
        else:
            cleaned["team"] = None
        if cleaned.get("gpu_model") is not None and cleaned.get("resource") not in (None, QuotaResource.GPUS):
            self.add_error("gpu_model", ValidationError("Only a GPU quota may name a GPU model.", code="invalid"))
        return cleaned


class QuotaLimitForm(forms.Form):
    """Change one quota's limit."""

    limit = forms.IntegerField(label="Limit", min_value=0, max_value=QUOTA_LIMIT_MAX)
