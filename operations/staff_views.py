"""
The staff console: the fleet by region, fabric and leaf switch; one node with its GPUs, steps,
attestations, incidents and ports; the ranked reservation queue and the scheduler's last cycle;
tenants' and teams' quotas with their usage.

Every page is a :func:`staff_page`: platform staff only (anyone else gets a 404, as the staff API
answers), reads for any platform role, writes by the API's role table (``tenants.permissions``).
Views parse, call one service with ``actor=request.principal`` and render; a service's refusal
(DomainError) becomes a form error or a flash message, never a 500. Each page costs a fixed
number of queries however many nodes, GPUs or rows it shows.
"""

from __future__ import annotations

from collections import defaultdict
from uuid import UUID

from django.conf import settings
from django.contrib import messages
from django.core.paginator import Paginator
from django.db.models import Count, Exists, F, FloatField, OuterRef, Q, Sum
from django.db.models.functions import Cast
from django.http import Http404
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.html import escape
from django.utils.http import urlencode
from django.utils.safestring import SafeString, mark_safe
from django.views.decorators.http import require_POST

from cloud import services as cloud_services
from cloud.choices import Health, NodePool, NodeState
from cloud.models import GPU, GPUModel, HCAPort, Node, Region
from cloud.telemetry import gpu_error_history, gpus_series
from cloud.telemetry.charts import gpu_sparklines
from cloud.transitions import NODE_RETURNABLE, NODE_TRANSITIONS
from core.errors import DomainError
from core.transitions import sources_of
from operations import nodes
from operations.occupancy import occupancy_chart
from operations.problems import problems_now
from operations.search import MIN_LENGTH, staff_search
from operations.staff_forms import (
    FleetFilterForm,
    MaintenanceForm,
    QuotaLimitForm,
    QuotaSetForm,
)
from operations.staff_queue import last_cycle_report
from provisioning.choices import InstanceState, OperationState
from provisioning.lifecycle.validate import node_validate
from provisioning.models import (
    VPC,
    AgentState,
    Allocation,
    Instance,
    NodeValidation,
    Operation,
    PortMembership,
    Reservation,
    StepRun,
)
from provisioning.transitions import QUOTA_STATES, WAITING_STATES
from security.models import AttestationReport, Incident
from tenants import services as tenant_services
from tenants.choices import QuotaResource
from tenants.models import Quota, Team, Tenant
from tenants.quotas import usage_now
from web.console import CHANGE, VIEW, add_domain_error, console_page, error_text, may, scoped, words


def _flash_error(request, exc: DomainError) -> None:
    messages.error(request, error_text(exc))


#
# Fleet
#

ZERO_UUID = UUID(int=0)
# States only a shared host takes: the legend shows them on its round tile.
SHARED_ONLY = {NodeState.IN_SERVICE}
# Health.values rebuilds its list on every access: read once, it is looked at per node.
HEALTHS = tuple(Health.values)


def _tile_health(row: dict) -> str:
    """The worst of the node's own health and its GPUs': one failed GPU makes the tile failed."""
    if row["health"] == Health.FAILED or row["gpus_failed"]:
        return Health.FAILED
    if row["health"] == Health.DEGRADED or row["gpus_degraded"]:
        return Health.DEGRADED
    if row["health"] == Health.UNKNOWN or (row["gpus"] and row["gpus_unknown"] == row["gpus"]):
        return Health.UNKNOWN
    return Health.HEALTHY


@console_page("nodes", platform=True)
def staff_home(request):
    """``/staff/``: what is wrong now, each problem linking to where to act (operations.problems)."""
    now = timezone.now()
    return render(request, "staff/home.html",
                  {"problems": problems_now(now), "cycle": last_cycle_report(now), "now": now})


@console_page("nodes", platform=True)
def search(request):
    """``/staff/search/?q=``: a node, reservation, tenant, address or GPU by what staff were told."""
    query = request.GET.get("q", "")
    return render(request, "staff/search.html", {"query": query, "found": staff_search(query),
                                                 "too_short": 0 < len(query.strip()) < MIN_LENGTH})


@console_page("nodes", platform=True)
def fleet(request):
    """Regions -> fabrics -> leaf switches -> node tiles coloured by state and health; counts on top."""
    regions = list(Region.objects.visible_to(request.principal).order_by("slug"))
    form = FleetFilterForm(request.GET or None, regions=regions)
    nodes = scoped(request, Node)
    chosen = form.cleaned_data if form.is_bound and form.is_valid() else {}
    if chosen.get("region"):
        nodes = nodes.filter(region__slug=chosen["region"])
    states = dict(nodes.order_by().values_list("state").annotate(n=Count("pk")))
    # GPU health per node in one grouped query over the GPUs (joining them into the node query
    # and counting with filters was most of this page's database time on a 1,280-node fleet).
    health_of: dict = defaultdict(lambda: dict.fromkeys(HEALTHS, 0))
    for node_id, health, n in (scoped(request, GPU).filter(node__in=nodes.values("pk")).order_by()
                               .values_list("node_id", "health").annotate(n=Count("pk"))):
        health_of[node_id][health] = n
    gpu_health = defaultdict(int)
    for counts in health_of.values():
        for health, n in counts.items():
            gpu_health[health] += n
    # GPUs held now per node (whole GPUs and fractional slots alike), in one grouped query.
    in_use = dict(scoped(request, Allocation).holding(timezone.now()).filter(node__in=nodes.values("pk")).order_by()
                  .values_list("node_id").annotate(n=Count("gpu_id", distinct=True)))
    if chosen.get("state"):
        nodes = nodes.filter(state=chosen["state"])
    rows = list(nodes.values("id", "hostname", "state", "health", "pool", "is_spare", "region__slug", "region__name",
                             "fabric_id", "fabric__slug", "fabric__name", "leaf_id", "leaf__name", "leaf__pod")
                .order_by("region__slug", "fabric__slug", "leaf__name", "hostname"))
    for row in rows:
        row.update({f"gpus_{h}": n for h, n in health_of[row["id"]].items()})
        row["gpus_in_use"] = in_use.get(row["id"], 0)
    tree = _fleet_tree(rows)
    return render(request, "staff/fleet.html", {
        "form": form,
        "tree": tree,
        "state_counts": [(state, label, states[state]) for state, label in NodeState.choices if states.get(state)],
        "node_total": sum(states.values()),
        "gpu_health": [(h, label, gpu_health.get(h, 0)) for h, label in Health.choices if gpu_health.get(h)],
        "gpu_total": sum(gpu_health.values()),
        "chosen_region": chosen.get("region", ""),
        "chosen_state": chosen.get("state", ""),
        "legend": [(state, label) for state, label in NodeState.choices if state not in SHARED_ONLY],
        "occupancy": occupancy_chart(timezone.now()),
    })


def _fleet_tree(rows) -> list[dict]:
    """Tile rows (ordered by region, fabric, leaf, hostname) as regions -> fabrics -> leaves -> nodes."""
    node_url = reverse("staff-node", args=[ZERO_UUID]).replace(str(ZERO_UUID), "{}")  # one reverse, not 1,280
    state_labels = dict(NodeState.choices)
    tree: dict = {}
    for row in rows:
        row["gpus"] = sum(row[f"gpus_{h}"] for h in HEALTHS)
        row["tile_health"] = _tile_health(row)
        row["url"] = node_url.format(row["id"])
        row["label"] = _tile_label(row, state_labels)
        region = tree.setdefault(row["region__slug"], {"name": row["region__name"], "slug": row["region__slug"],
                                                       "fabrics": {}})
        fabric = region["fabrics"].setdefault(row["fabric_id"], {"name": row["fabric__name"],
                                                                 "slug": row["fabric__slug"], "leaves": {}, "nodes": 0})
        leaf = fabric["leaves"].setdefault(row["leaf_id"], {"name": row["leaf__name"], "pod": row["leaf__pod"],
                                                            "nodes": [], "problems": 0})
        leaf["nodes"].append(row)
        leaf["problems"] += row["tile_health"] in (Health.FAILED, Health.DEGRADED)
        fabric["nodes"] += 1
    for region in tree.values():
        region["fabrics"] = list(region["fabrics"].values())
        for fabric in region["fabrics"]:
            fabric["leaves"] = list(fabric["leaves"].values())
            for leaf in fabric["leaves"]:
                leaf["tiles"] = _tiles(leaf["nodes"])
    return list(tree.values())


def _tiles(nodes: list[dict]) -> SafeString:
    """
    A leaf's node tiles as HTML: formatted here because a 1,280-node fleet is 1,280 tiles and the
    template engine took most of the page's time on them. Only the label holds free text (the
    hostname); state, health, pool, the fill and the URL are enumerations, numbers and a UUID.
    A shared host is a round tile of its own colour; the share of a node's GPUs in use fills it
    from the bottom, in eighths (``used-0`` .. ``used-8``).
    """
    return mark_safe("".join(  # noqa: S308 -- every free-text part is escaped just here
        f'<li><a class="tile state-{n["state"]} health-{n["tile_health"]} pool-{n["pool"].replace("_", "-")} '
        f'used-{_eighths(n["gpus_in_use"], n["gpus"])}{" spare" if n["is_spare"] else ""}" '
        f'href="{n["url"]}" title="{escape(n["label"])}"></a></li>' for n in nodes))


def _eighths(used: int, total: int) -> int:
    """How many eighths of a tile to fill: any use shows at least one, only full use all eight."""
    if not total or not used:
        return 0
    return 8 if used >= total else min(7, max(1, round(8 * used / total)))


def _tile_label(row: dict, state_labels: dict) -> str:
    health = ", ".join(f"{row[f'gpus_{h}']} {h}" for h in HEALTHS if row[f"gpus_{h}"]) or "no GPUs"
    spare = ", spare" if row["is_spare"] else ""
    kind = "Shared host" if row["pool"] == NodePool.SHARED else "Bare-metal node"
    state = state_labels.get(row["state"], row["state"]).replace(" (shared host)", "")
    return f"{row['hostname']}: {kind}, {state.lower()}{spare}; {row['gpus_in_use']} of {row['gpus']} GPUs in use; " \
           f"node {row['health']}; GPUs {health}"


#
# Node
#

UNFINISHED = [OperationState.PENDING, OperationState.RUNNING]
MAINTENANCE_FROM = sources_of(NODE_TRANSITIONS, NodeState.MAINTENANCE)
VALIDATE_FROM = sources_of(NODE_TRANSITIONS, NodeState.VALIDATING) | {NodeState.VALIDATING}
STEPS_SHOWN = 40
OPERATIONS_SHOWN = 10


def _node_or_404(request, pk, action: str = VIEW) -> Node:
    nodes = scoped(request, Node, action).select_related("region", "fabric", "leaf").defer("bmc_password")
    return get_object_or_404(nodes, pk=pk)


def _progress(request, node: Node) -> dict:
    """The live part of the node page: its state, its operations (running first) and recent steps."""
    touching = Q(node=node) | Q(reservation__instances__node=node)
    operations = list(scoped(request, Operation).filter(touching).distinct()
                      .select_related("reservation__tenant").order_by("-created_at")[:OPERATIONS_SHOWN])
    steps = list(StepRun.objects.filter(Q(node=node) | Q(operation__reservation__instances__node=node))
                 .distinct().select_related("operation").order_by("-id")[:STEPS_SHOWN])
    for step in steps:
        step.took = (step.finished_at - step.started_at).total_seconds() if step.finished_at else None
    running = [op for op in operations if op.state in UNFINISHED]
    return {"node": node, "operations": operations, "steps": steps, "running": running}


@console_page("nodes", platform=True)
def node_detail(request, pk):
    """One node: GPUs with their current tenant, live operations and steps, attestations, incidents, ports."""
    node = _node_or_404(request, pk)
    now = timezone.now()
    gpus = list(node.gpus.select_related("model").order_by("index"))
    held = defaultdict(list)
    for allocation in (scoped(request, Allocation).holding(now).filter(node=node)
                       .select_related("reservation__tenant", "reservation__team")):
        held[allocation.gpu_id].append(allocation)
    telemetry = gpus_series([gpu.pk for gpu in gpus], now=now)
    errors = gpu_error_history([gpu.pk for gpu in gpus], now=now)
    for gpu in gpus:
        gpu.current = held.get(gpu.pk, [])
        gpu.latest = telemetry[gpu.pk]["latest"]
        gpu.errors = errors[gpu.pk]
        gpu.charts = gpu_sparklines(telemetry[gpu.pk]["series"], memory_mib=gpu.memory_mib)
    ports = list(scoped(request, HCAPort).filter(node=node).select_related("status").order_by("index"))
    members = {m.guid: m for m in scoped(request, PortMembership).filter(
        guid__in=[p.guid for p in ports], left_at__isnull=True).select_related("vpc__tenant")}
    for port in ports:
        port.membership = members.get(port.guid)
        port.link_status = getattr(port, "status", None)  # none until its first report
    context = _progress(request, node) | {
        "gpus": gpus,
        "ports": ports,
        "reports": list(scoped(request, AttestationReport).filter(node_id=node.pk)[:10]),
        "validation": (validation := scoped(request, NodeValidation).filter(node=node).first()),
        "failed_checks": [check for check in validation.results if not check["passed"]] if validation else [],
        "incidents": _in_words(list(scoped(request, Incident).filter(node_id=node.pk)[:20])),
        "maintenance_form": MaintenanceForm(),
        "last_seen": AgentState.objects.filter(node=node).values_list("last_seen_at", flat=True).first(),
    }
    context |= _node_actions(request, node, context["running"])
    return render(request, "staff/node.html", context)


def _in_words(incidents: list) -> list:
    for incident in incidents:
        incident.kind_words = words(incident.kind)
    return incidents


def _node_actions(request, node: Node, running: list) -> dict:
    """Which actions the page offers: only what the role table and the node's state allow."""
    can = may(request.principal, "nodes")
    validating = any(op.kind == "validate" for op in running)
    return {
        "can_hold": can and node.state in MAINTENANCE_FROM,
        "can_return": can and node.state == NodeState.MAINTENANCE,
        "can_validate": can and node.state in VALIDATE_FROM and not validating,
        "can_repair": can and node.state in (NodeState.FAULTY, NodeState.QUARANTINED),
        "can_repair_done": can and node.state == NodeState.REPAIR,
        "returns_to": NodeState(node.previous_state if node.previous_state in NODE_RETURNABLE
                                else NodeState.VALIDATING).label,
    }


@console_page("nodes", platform=True)
def node_progress(request, pk):
    """The node page's live part, polled by htmx every 2 s while an operation runs."""
    node = _node_or_404(request, pk)
    return render(request, "staff/_node_progress.html", _progress(request, node))


def _hold(request, node):
    form = MaintenanceForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Give a reason for the maintenance hold (at most 500 characters).")
        return
    nodes.node_maintenance_start(actor=request.principal, node=node, reason=form.cleaned_data["reason"])
    messages.success(request, f"{node.hostname} is held for maintenance.")


def _return(request, node):
    node = cloud_services.node_maintenance_end(actor=request.principal, node=node)
    messages.success(request, f"{node.hostname} left maintenance: now {node.get_state_display().lower()}.")


def _validate(request, node):
    operation = node_validate(actor=request.principal, node=node)
    messages.success(request, f"Validation (burn-in) of {node.hostname} runs: step {operation.step}.")


def _repair(request, node):
    node = cloud_services.node_repair_start(actor=request.principal, node=node,
                                            reason=request.POST.get("reason", "").strip()[:500])
    messages.success(request, f"{node.hostname} is in repair; it is sold again only after it passes validation.")


def _repaired(request, node):
    node = nodes.node_repair_done(actor=request.principal, node=node)
    messages.success(request, f"{node.hostname} is repaired: validation runs, then it is sold again if it passes.")


NODE_ACTIONS = {"maintenance": _hold, "return": _return, "validate": _validate, "repair": _repair,
                "repaired": _repaired}


@console_page("nodes", platform=True)
@require_POST
def node_act(request, pk, verb: str):
    """Hold for maintenance, return to service, run validation (burn-in), send to repair and back: platform admins."""
    act = NODE_ACTIONS.get(verb)
    if act is None:
        raise Http404("No such action.")
    node = _node_or_404(request, pk, CHANGE)
    try:
        act(request, node)
    except DomainError as exc:
        _flash_error(request, exc)
    return redirect("staff-node", pk=node.pk)


#
# Quotas
#

QUOTAS_PER_PAGE = 100


def _quota_forms(request, data=None) -> QuotaSetForm:
    in_fleet = Exists(GPU.objects.filter(model=OuterRef("pk")))  # a quota on a model the fleet lacks limits nothing
    return QuotaSetForm(data, tenants=scoped(request, Tenant), teams=scoped(request, Team),
                        gpu_models=list(GPUModel.objects.visible_to(request.principal).filter(in_fleet)
                                        .order_by("slug")),
                        auto_id="quota-%s")


@console_page("quotas", platform=True)
def quotas(request):
    """Every tenant's and team's quotas with their usage; platform admins set (POST), edit and delete them."""
    form = _quota_forms(request, request.POST if request.method == "POST" else None)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        try:
            quota, created = tenant_services.quota_set(
                actor=request.principal, tenant=data["tenant"], team=data["team"], resource=data["resource"],
                gpu_model=data["gpu_model"], limit=data["limit"])
        except DomainError as exc:
            add_domain_error(form, exc)
        else:
            messages.success(request, f"Quota {'set' if created else 'changed'}: {quota} = {quota.limit}.")
            return redirect(f"{reverse('staff-quotas')}?{urlencode({'tenant': quota.tenant.slug})}")
    return _quota_page(request, form, status=400 if form.is_bound else 200)


@console_page("quotas", platform=True)
@require_POST
def quota_edit(request, pk):
    """Change one quota's limit (the same service as setting it)."""
    quota = get_object_or_404(scoped(request, Quota, CHANGE).select_related("tenant", "team__tenant", "gpu_model"),
                              pk=pk)
    form = QuotaLimitForm(request.POST, auto_id=f"limit-{quota.pk}-%s")
    if form.is_valid():
        try:
            tenant_services.quota_set(actor=request.principal, tenant=quota.tenant, team=quota.team,
                                      resource=quota.resource, gpu_model=quota.gpu_model,
                                      limit=form.cleaned_data["limit"])
        except DomainError as exc:
            add_domain_error(form, exc)
        else:
            messages.success(request, f"Quota changed: {quota} = {form.cleaned_data['limit']}.")
            return redirect(_back_to_quotas(request))
    return _quota_page(request, _quota_forms(request), edit_errors={quota.pk: form}, status=400)


@console_page("quotas", platform=True)
@require_POST
def quota_delete(request, pk):
    """Remove a quota row: the tenant's own (or the default) limit applies again."""
    quota = get_object_or_404(scoped(request, Quota, CHANGE).select_related("tenant", "team__tenant", "gpu_model"),
                              pk=pk)
    label = str(quota)
    try:
        tenant_services.quota_delete(actor=request.principal, quota=quota)
    except DomainError as exc:
        _flash_error(request, exc)
    else:
        messages.success(request, f"Quota removed: {label}.")
    return redirect(_back_to_quotas(request))


def _back_to_quotas(request) -> str:
    search = request.POST.get("back_tenant", "").strip()[:50]
    url = reverse("staff-quotas")
    return f"{url}?{urlencode({'tenant': search})}" if search else url


def _quota_page(request, form, *, edit_errors=None, status=200):
    rows = scoped(request, Quota).select_related("tenant", "team__tenant", "gpu_model").order_by(
        "tenant__name", "tenant__slug", F("team__name").asc(nulls_first=True), "resource", "gpu_model__slug")
    search = (request.GET.get("tenant") or "").strip()[:50]
    if search:
        rows = rows.filter(Q(tenant__slug__icontains=search) | Q(tenant__name__icontains=search))
    page = Paginator(rows, QUOTAS_PER_PAGE).get_page(request.GET.get("page"))
    quotas_shown = list(page)
    usage = quota_usage(request, quotas_shown, now=timezone.now())
    edit_errors = edit_errors or {}
    for quota in quotas_shown:
        quota.usage = usage[quota.pk]
        quota.edit_form = edit_errors.get(quota.pk) or QuotaLimitForm(initial={"limit": quota.limit},
                                                                      auto_id=f"limit-{quota.pk}-%s")
    return render(request, "staff/quotas.html", {
        "form": form,
        "page": page,
        "quotas": quotas_shown,
        "search": search,
        "defaults": [(label, settings.MERIDIAN_DEFAULT_QUOTAS[value]) for value, label in QuotaResource.choices],
        "can_edit": may(request.principal, "quotas"),
    }, status=status)


def quota_usage(request, quotas: list[Quota], *, now) -> dict:
    """
    What counts against each quota, for a page of quotas at once (three grouped queries):
    GPUs held now and GPUs waiting or booked ahead (as admission counts them, fractional slots as
    GPU shares); VPCs that are not deleted (defaults aside); instances provisioning or running.
    """
    tenant_ids = {q.tenant_id for q in quotas}
    usage = {q.pk: {"now": 0.0, "ahead": 0.0} for q in quotas}
    if not quotas:
        return usage
    live = Q(state__in=QUOTA_STATES, starts_at__lte=now, ends_at__gt=now)
    slots = Cast("units", FloatField()) / F("offering__slots_per_gpu")
    gpu_rows = list(
        scoped(request, Reservation).filter(tenant_id__in=tenant_ids, state__in=QUOTA_STATES | WAITING_STATES)
        .values("tenant_id", "team_id", "gpu_model_id").order_by()
        .annotate(now_whole=Sum("gpus", filter=live), now_slots=Sum(slots, filter=live & Q(gpus=0)),
                  all_whole=Sum("gpus"), all_slots=Sum(slots, filter=Q(gpus=0))))
    vpcs = _counts(scoped(request, VPC).filter(tenant_id__in=tenant_ids, is_default=False).exclude(state="deleted"))
    instances = _counts(scoped(request, Instance).filter(
        tenant_id__in=tenant_ids, state__in=[InstanceState.PROVISIONING, InstanceState.ACTIVE]))
    for q in quotas:
        def mine(tenant_id, team_id, q=q):
            return tenant_id == q.tenant_id and (q.team_id is None or team_id == q.team_id)

        if q.resource == QuotaResource.GPUS:
            rows = [r for r in gpu_rows if mine(r["tenant_id"], r["team_id"])
                    and q.gpu_model_id in (None, r["gpu_model_id"])]
            held = sum((r["now_whole"] or 0) + (r["now_slots"] or 0) for r in rows)
            counted = sum((r["all_whole"] or 0) + (r["all_slots"] or 0) for r in rows)
            usage[q.pk] = {"now": held, "ahead": counted - held}
        elif q.resource in (QuotaResource.VPCS, QuotaResource.INSTANCES):
            counts = vpcs if q.resource == QuotaResource.VPCS else instances
            usage[q.pk] = {"now": sum(n for (tenant, team), n in counts.items() if mine(tenant, team)), "ahead": 0}
        else:
            usage[q.pk] = {"now": usage_now(q.resource, q.tenant_id, q.team_id) or 0, "ahead": 0}
        usage[q.pk]["over"] = usage[q.pk]["now"] + usage[q.pk]["ahead"] > q.limit
    return usage


def _counts(queryset) -> dict:
    return {(t, tm): n for t, tm, n in queryset.values_list("tenant_id", "team_id").order_by().annotate(n=Count("pk"))}
