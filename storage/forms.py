"""The console's storage forms: checked here for shape, by the services for everything else."""

from __future__ import annotations

from django import forms

from storage.choices import NAME
from storage.models import StorageClass
from tenants.forms import TeamChoiceField
from tenants.models import Team
from web.console import chosen_team_id, scoped


class ClassChoiceField(forms.ModelChoiceField):
    def label_from_instance(self, storage_class: StorageClass) -> str:
        return (f"{storage_class.region.name} · {storage_class.name} — {dollars(storage_class.price_per_gib_month)}"
                f"/GiB-month, {storage_class.min_gib:,}–{storage_class.max_gib:,} GiB")


def dollars(price) -> str:
    """$0.10, $0.02, $0.0125: cents where they say it all, more places where they do not."""
    return f"${price:.2f}" if price == round(price, 2) else f"${price.normalize()}"


class VolumeForm(forms.Form):
    name = forms.RegexField(NAME, max_length=63, help_text="Lower-case letters, digits and dashes, e.g. checkpoints.",
                            error_messages={"invalid": "Use lower-case letters, digits and dashes, starting and "
                                                       "ending with a letter or digit (e.g. checkpoints)."})
    storage_class = ClassChoiceField(queryset=StorageClass.objects.none(), label="Region and kind", empty_label=None)
    size_gib = forms.IntegerField(min_value=1, max_value=2**31 - 1, label="Size (GiB)", initial=1024)
    team = TeamChoiceField(queryset=Team.objects.none(), required=False, empty_label="Tenant-wide",
                           help_text="Whose storage quota it counts against.")

    def __init__(self, *args, request, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["storage_class"].queryset = (scoped(request, StorageClass).select_related("region")
                                                 .exclude(kind="scratch").order_by("region__name", "kind"))
        teams = scoped(request, Team).order_by("name")
        if not request.principal.sees_all_teams:
            teams = teams.filter(pk__in=request.principal.team_ids)
        self.fields["team"].queryset = teams
        if not self.is_bound and (team_id := chosen_team_id(request)):
            self.initial["team"] = team_id
