"""
The console's VPC pages: the list, the new-VPC form, a VPC's page with its members, the
isolation report, and delete. Thin: every change is ``provisioning.networks.vpcs`` (the API's door too),
and a refusal (a taken name, an overlapping subnet, over quota, in use) comes back onto the form
or as a flash message with the service's own words.
"""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db.models import Count, Q
from django.http import JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import path
from django.utils.dateparse import parse_datetime
from django.views.decorators.http import require_POST

from cloud.models import Fabric, Region
from core.errors import DomainError
from provisioning import services
from provisioning.choices import VPCState
from provisioning.drivers.fabric import MTUS
from provisioning.models import VPC
from provisioning.networks import vpcs
from provisioning.networks.ports import isolation_report, vpc_members
from tenants.forms import TeamChoiceField
from tenants.models import Team
from web.console import (
    CHANGE,
    add_domain_error,
    chosen_team_id,
    console_page,
    error_text,
    may,
    messages_of,
    scoped,
    scoped_or_404,
)

PAGE_SIZE = 50
NAME_PATTERN = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"  # the API's (provisioning.api.networks.NAME)
GONE = (VPCState.DELETING, VPCState.DELETED)


class FabricChoiceField(forms.ModelChoiceField):
    def label_from_instance(self, fabric: Fabric) -> str:
        return f"{fabric.region.name} · {fabric.name}"


class VPCForm(forms.Form):
    name = forms.RegexField(NAME_PATTERN, max_length=63,
                            help_text="Lower-case letters, digits and dashes, e.g. training-net.",
                            error_messages={"invalid": "Use lower-case letters, digits and dashes, starting and ending "
                                                       "with a letter or digit (e.g. training-net)."})
    fabric = FabricChoiceField(queryset=Fabric.objects.none(), label="Region and fabric", empty_label=None,
                               help_text="Reservations that use this VPC run on this fabric's nodes.")
    cidr = forms.CharField(max_length=43, required=False, label="IPoIB subnet (CIDR)",
                           widget=forms.TextInput(attrs={"placeholder": "10.20.0.0/24", "spellcheck": "false"}),
                           help_text="A private range from /16 to /28, e.g. 10.20.0.0/24. Leave empty for a free /24.")
    team = TeamChoiceField(queryset=Team.objects.none(), required=False, empty_label="Tenant-wide",
                           help_text="Whose VPC quota it counts against; tenant-wide VPCs serve every team.")
    mtu = forms.TypedChoiceField(choices=[(m, f"{m} bytes") for m in MTUS], coerce=int, initial=4096, label="IB MTU")
    service_level = forms.IntegerField(min_value=0, max_value=15, initial=0, label="Service level (0-15)")

    def __init__(self, *args, request, **kwargs):
        super().__init__(*args, **kwargs)
        principal = request.principal
        # The fabrics of the regions on sale, as the API picks one of a region it names.
        self.fields["fabric"].queryset = (Fabric.objects.filter(region__in=scoped(request, Region))
                                          .select_related("region").order_by("region__name", "name"))
        teams = scoped(request, Team).order_by("name")
        if not principal.sees_all_teams:
            teams = teams.filter(pk__in=principal.team_ids)  # members make VPCs for their own teams only
        self.fields["team"].queryset = teams
        if not self.is_bound and (team_id := chosen_team_id(request)):
            self.initial["team"] = team_id

    def clean_cidr(self):
        """The service's check of the subnet's form, named with the other mistakes (overlaps are the service's)."""
        cidr = self.cleaned_data["cidr"].strip()
        if cidr:
            try:
                vpcs.parse_cidr(cidr)
            except DomainError as exc:
                raise forms.ValidationError(messages_of(exc.detail)) from None
        return cidr


#
# List, create
#


@console_page("vpcs")
def vpc_list(request):
    """The VPCs the principal can see (deleted ones on request), with their live instances."""
    vpc_rows = _listed(request)
    show_deleted = request.GET.get("state") == VPCState.DELETED
    vpc_rows = vpc_rows.filter(state=VPCState.DELETED) if show_deleted else vpc_rows.exclude(state=VPCState.DELETED)
    team_id = chosen_team_id(request)
    if team_id:
        vpc_rows = vpc_rows.filter(Q(team_id=team_id) | Q(team__isnull=True))
    page = Paginator(vpc_rows.order_by("name"), PAGE_SIZE).get_page(request.GET.get("page"))
    return render(request, "provisioning/vpc_list.html", {"page": page, "show_deleted": show_deleted})


def _listed(request):
    return scoped(request, VPC.objects.select_related("fabric__region", "team")).annotate(
        members=Count("memberships__instance", filter=Q(memberships__left_at__isnull=True), distinct=True))


@console_page("vpcs")
def vpc_new(request):
    if not may(request.principal, "vpcs"):
        raise PermissionDenied("Your role does not allow creating VPCs.")
    form = VPCForm(request.POST or None, request=request)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        try:
            team = services.team_for(request.principal, data["team"])
            vpc = vpcs.vpc_create(actor=request.principal, fabric=data["fabric"], name=data["name"],
                                  cidr=data["cidr"] or None, mtu=data["mtu"], service_level=data["service_level"],
                                  team=team)
        except DomainError as exc:
            add_domain_error(form, exc)
        else:
            messages.success(request, f"VPC {vpc.name} is created with subnet {vpc.cidr}; its partition is being "
                                      "made on the fabric.")
            return redirect("vpc-detail", pk=vpc.pk)
    return render(request, "provisioning/vpc_new.html", {"form": form})


#
# One VPC
#


@console_page("vpcs")
def vpc_detail(request, pk):
    vpc = get_object_or_404(_listed(request), pk=pk)
    members, _ = vpc_members(vpc, related=("reservation",))
    return render(request, "provisioning/vpc_detail.html", {
        "vpc": vpc, "members": members,
        "can_delete": vpc.state not in GONE and scoped(request, VPC, CHANGE).filter(pk=vpc.pk).exists(),
    })


@console_page("vpcs")
def vpc_isolation(request, pk):
    """
    The isolation report (partition, members, what the fabric shows now, the reconciler's findings):
    a part of the VPC's page loaded by htmx, a page of its own without script, or JSON for auditors.
    """
    vpc = scoped_or_404(request, VPC.objects.select_related("fabric__region"), pk=pk)
    report = None if vpc.state == VPCState.DELETED else isolation_report(vpc)
    if request.GET.get("format") == "json":
        if report is None:
            return JsonResponse({"detail": "The VPC is deleted; its partition is gone."}, status=409)
        response = JsonResponse(report)
        response["Content-Disposition"] = f'attachment; filename="isolation-report-{vpc.name}.json"'
        return response
    template = "provisioning/vpc_isolation.html" if request.htmx else "provisioning/vpc_isolation_page.html"
    return render(request, template, {"vpc": vpc, "report": report and _readable(report)})


def _readable(report: dict) -> dict:
    """The report with its ISO timestamps as datetimes, for the template's date filter."""
    last = report["last_reconciliation"]
    return {
        **report, "generated_at": parse_datetime(report["generated_at"]),
        "last_reconciliation": last and {**last, "at": parse_datetime(last["at"])},
        "drift_last_30_days": [{**d, "at": parse_datetime(d["at"])} for d in report["drift_last_30_days"]],
    }


@require_POST
@console_page("vpcs")
def vpc_delete(request, pk):
    vpc = scoped_or_404(request, VPC, CHANGE, pk=pk)
    try:
        vpc = vpcs.vpc_delete(actor=request.principal, vpc=vpc)
    except DomainError as exc:
        messages.error(request, error_text(exc))
        return redirect("vpc-detail", pk=pk)
    messages.success(request, f"VPC {vpc.name} is being deleted; its P_Key is freed once the fabric confirms.")
    return redirect("vpc-list")


urlpatterns = [
    path("vpcs/", vpc_list, name="vpc-list"),
    path("vpcs/new/", vpc_new, name="vpc-new"),
    path("vpcs/<uuid:pk>/", vpc_detail, name="vpc-detail"),
    path("vpcs/<uuid:pk>/isolation/", vpc_isolation, name="vpc-isolation"),
    path("vpcs/<uuid:pk>/delete/", vpc_delete, name="vpc-delete"),
]
