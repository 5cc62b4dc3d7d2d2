"""
The console's reservation form. It renders and parses what a person types; the rules are the
API's: the cleaned form becomes the same payload ``ReservationCreateSerializer`` validates, so
a reservation made in the browser is checked exactly like one made with curl.
"""

from __future__ import annotations

from django import forms
from django.utils import timezone
from rest_framework import serializers

from cloud.choices import OfferingKind
from cloud.models import Image, Offering, Region
from cloud.pricing import ON_DEMAND, prices_now
from core.errors import DomainError
from provisioning.admission import best_offering_for_spec, count_field
from provisioning.api.serializers import ReservationCreateSerializer, validate_ssh_public_key
from provisioning.choices import BillingTerm, EvictionPolicy
from provisioning.models import VPC
from provisioning.scheduling.priority import URGENCY_LEVELS
from tenants.models import SSHKey, Team
from web.console import add_domain_error

START_CHOICES = [("now", "As soon as possible"), ("window", "At a set time (advance reservation)")]
MODE_CHOICES = [("offering", "An offering"), ("spec", "A logical GPU (minimum compute and memory)")]


def region_label(region: Region) -> str:
    """A region as a person picks it: its name and the slug the API, the estimate and its page use."""
    if region.name.replace(" ", "-").lower() == region.slug:  # a name that only spells the slug
        return region.slug
    return f"{region.name} ({region.slug})"


class ReservationForm(forms.Form):
    name = forms.CharField(max_length=100, help_text="A name you will recognise, e.g. llm-finetune-3.")
    mode = forms.ChoiceField(choices=MODE_CHOICES, initial="offering", widget=forms.RadioSelect, label="Reserve")
    offering = forms.ChoiceField(required=False, help_text="GPU model, kind and list price per GPU-hour.")
    spec_kind = forms.ChoiceField(choices=OfferingKind.choices, required=False, label="Kind")
    spec_min_fp16_tflops = forms.FloatField(required=False, min_value=0, label="Minimum FP16 TFLOPS per GPU")
    spec_min_memory_gib = forms.IntegerField(required=False, min_value=1, label="Minimum memory per GPU (GiB)")
    count = forms.IntegerField(min_value=1, max_value=100_000, initial=1,
                               help_text="GPUs for VMs and containers, nodes for bare metal, slots for fractional.")
    region = forms.ChoiceField(help_text="Where it should run.")
    burst_regions = forms.MultipleChoiceField(required=False, widget=forms.CheckboxSelectMultiple,
                                              label="If that region is full, also accept")
    start_mode = forms.ChoiceField(choices=START_CHOICES, initial="now", widget=forms.RadioSelect, label="Start")
    start = forms.DateTimeField(required=False, label="Start at (UTC)",
                                widget=forms.DateTimeInput(attrs={"type": "datetime-local"}))
    duration_hours = forms.FloatField(min_value=0.01, max_value=24 * 366, initial=8, label="Duration (hours)")
    billing_term = forms.ChoiceField(choices=BillingTerm.choices, initial=BillingTerm.ON_DEMAND)
    spot_max_price = forms.DecimalField(required=False, min_value=0, max_digits=8, decimal_places=4,
                                        label="Spot: max price per GPU-hour ($)")
    eviction_policy = forms.ChoiceField(choices=EvictionPolicy.choices, initial=EvictionPolicy.SOFT,
                                        label="Spot: eviction")
    urgency = forms.ChoiceField(choices=[(k, f"{k.title()} ({v:g})") for k, v in URGENCY_LEVELS.items()],
                                initial="normal")
    team = forms.ChoiceField(required=False, help_text="Whose quota and record it counts against.")
    vpc = forms.ChoiceField(required=False, label="VPC",
                            help_text="Empty: your default VPC on the fabric it lands on.")
    image = forms.ChoiceField(required=False, help_text="What its instances boot; the offering's default if left.")
    ssh_keys = forms.MultipleChoiceField(required=False, widget=forms.CheckboxSelectMultiple, label="Saved SSH keys",
                                         help_text="Your keys and the tenant's shared ones (SSH keys page).")
    ssh_public_key = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 3}),
                                     label="Or paste an SSH public key",
                                     help_text="Installed for the login user of each instance, with the saved ones.")

    def __init__(self, *args, request, for_estimate: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.request = request
        # An estimate needs no name: the panel fills in before one is typed.
        self.for_estimate = for_estimate
        self.fields["name"].required = not for_estimate
        offerings = Offering.objects.filter(is_active=True).select_related("gpu_model").order_by("kind", "name")
        self.offerings = {o.slug: o for o in offerings}
        prices = prices_now(offerings, at=timezone.now())  # the price book's on-demand price, as it will be billed
        self.fields["offering"].choices = [("", "Choose an offering")] + [
            (o.slug, f"{o.name} · {o.get_kind_display()} · ${prices[o.pk][ON_DEMAND]:.2f}/GPU-h on demand")
            for o in offerings]
        regions = [(r.slug, region_label(r)) for r in Region.objects.filter(is_active=True).order_by("slug")]
        self.fields["region"].choices = regions
        self.fields["burst_regions"].choices = regions
        principal = request.principal
        teams = Team.objects.visible_to(principal).order_by("name")
        if not principal.sees_all_teams:
            teams = teams.filter(pk__in=principal.team_ids)  # one books only for one's own teams
        self.fields["team"].choices = [("", "Tenant-wide")] + [(str(t.pk), t.name) for t in teams]
        self.fields["image"].choices = [("", "Default for the offering")] + [
            (str(i.pk), f"{i.name} · {i.get_kind_display()}{' · yours' if i.tenant_id else ''}")
            for i in Image.objects.visible_to(principal).filter(state=Image.State.ACTIVE).order_by("kind", "name")]
        self.fields["ssh_keys"].choices = [
            (str(k.pk), f"{k.name} · {k.kind} · {k.fingerprint}{' · shared' if k.user_id is None else ''}")
            for k in SSHKey.objects.visible_to(principal).order_by("name", "created_at")]
        self.fields["vpc"].choices = [("", "Default VPC")] + [
            (str(v.pk), f"{v.name} ({v.cidr})") for v in VPC.objects.visible_to(principal).order_by("name")]

    def clean_ssh_public_key(self):
        """The API's check of the key, run with the form's own (so a bad key is named with every other mistake)."""
        key = self.cleaned_data.get("ssh_public_key", "").strip()
        if key:
            try:
                validate_ssh_public_key(key)
            except serializers.ValidationError as exc:
                raise forms.ValidationError([str(message) for message in exc.detail]) from None
        return key

    def clean(self):
        data = super().clean()
        if data.get("mode") == "offering" and not data.get("offering"):
            self.add_error("offering", "Choose an offering, or reserve a logical GPU instead.")
        if data.get("mode") == "spec":
            for name in ("spec_kind", "spec_min_fp16_tflops", "spec_min_memory_gib"):
                if data.get(name) in (None, ""):
                    self.add_error(name, "Needed for a logical GPU.")
        if data.get("start_mode") == "window" and not data.get("start"):
            self.add_error("start", "Give the start time of the advance reservation.")
        if data.get("billing_term") == BillingTerm.SPOT and data.get("spot_max_price") is None:
            self.add_error("spot_max_price", "A spot reservation needs the most you will pay per GPU-hour.")
        return data

    def is_empty(self, name: str) -> bool:
        """Whether nothing was given for field ``name`` (an untouched field, not a wrong one)."""
        field = self.fields[name]
        return field.widget.value_from_datadict(self.data, self.files, self.add_prefix(name)) in field.empty_values

    def focus_first_error(self) -> None:
        """The first field (in the form's order) with an error gets the focus when the page is drawn."""
        first = next((name for name in self.fields if name in self.errors), None)
        if first is not None:
            self.fields[first].widget.attrs["autofocus"] = True

    def payload(self) -> dict:
        """The API payload of the cleaned form (with the count under the name its offering sells by)."""
        d = self.cleaned_data
        regions = [d["region"]] + [r for r in d.get("burst_regions") or [] if r != d["region"]]
        payload = {"name": d["name"] or "estimate", "regions": regions, "duration_hours": d["duration_hours"],
                   "billing_term": d["billing_term"], "eviction_policy": d["eviction_policy"],
                   "urgency": d["urgency"], "ssh_public_key": d.get("ssh_public_key", "").strip()}
        if d["mode"] == "spec":
            payload["spec"] = {"kind": d["spec_kind"], "min_fp16_tflops": d["spec_min_fp16_tflops"],
                               "min_memory_gib": d["spec_min_memory_gib"]}
            offering = self._best_for_spec(payload["spec"])
        else:
            payload["offering"] = d["offering"]
            offering = self.offerings.get(d["offering"])
        if offering is not None:
            payload[count_field(offering)] = d["count"]
        else:
            payload["gpus"] = d["count"]  # the serializer names what is wrong with the spec
        if d.get("start_mode") == "window":
            payload["start"] = d["start"]
        if d["billing_term"] == BillingTerm.SPOT:
            payload["spot_max_price"] = d.get("spot_max_price")
        if d.get("team"):
            payload["team"] = d["team"]
        if d.get("vpc"):
            payload["vpc"] = d["vpc"]
        if d.get("image"):
            payload["image"] = d["image"]
        if d.get("ssh_keys"):
            payload["ssh_keys"] = list(d["ssh_keys"])
        return payload

    @staticmethod
    def _best_for_spec(spec: dict) -> Offering | None:
        try:
            return best_offering_for_spec(**spec)
        except DomainError:
            return None

    def validated(self):
        """The API serializer over this form's payload: errors land on the form's fields, else the Ask."""
        serializer = ReservationCreateSerializer(data=self.payload(), context={"request": self.request})
        try:
            if serializer.is_valid():
                return serializer.validated_data
        except DomainError as exc:  # raised inside validation (no offering fits the spec): the API's 400
            add_domain_error(self, exc, aliases={"spec": "spec_kind"})
            return None
        self.add_api_errors(serializer.errors)
        return None

    def add_api_errors(self, errors: dict) -> None:
        """Put the API's messages on the form's fields (the count's name is the form's ``count``)."""
        aliases = {"gpus": "count", "nodes": "count", "slots": "count", "regions": "region", "start": "start",
                   "spec": "spec_kind", "non_field_errors": None}
        for name, messages in errors.items():
            if isinstance(messages, dict):  # a nested serializer: the spec's own fields
                for sub, sub_messages in messages.items():
                    self.add_error(f"spec_{sub}" if f"spec_{sub}" in self.fields else None,
                                   [str(m) for m in sub_messages])
                continue
            field = aliases.get(name, name)
            if field is not None and field not in self.fields:
                field = None
            self.add_error(field, [str(m) for m in (messages if isinstance(messages, list) else [messages])])
