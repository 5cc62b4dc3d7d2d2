"""
Endpoints: create, change and delete (the replicas follow through inference.replicas). Every check
that can fail is made before anything is written, so a refused request leaves nothing behind.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import IntegrityError, transaction

from cloud.choices import MAX_TASKS_PER_GPU, IsolationMode, NodePool, OfferingKind, TimeSliceClass
from cloud.models import GPUModel, Image, Node, Offering, Region
from core.errors import Conflict, Forbidden, invalid
from inference import replicas
from inference.choices import EndpointState
from inference.models import Endpoint
from provisioning.admission import environment_check
from provisioning.services import team_for
from security.audit import audit_record

AUDITED = ("name", "offering_id", "regions", "min_replicas", "max_replicas", "target_utilization", "scale_in_below",
           "state")
SHARE_KINDS = ("gpu", "mig", "slot", "time_slice")


@dataclass(frozen=True)
class Share:
    """What one replica holds: a whole GPU, a MIG slice, a memory-capped slot or a time slice of ``1/fraction``."""

    gpu_model: str
    kind: str = "gpu"
    fraction: int = 1
    time_slice_class: str = ""


def offering_for(share: Share) -> Offering:
    """The offering on sale that gives ``share``; a 400 naming what is wrong, or what is sold instead."""
    if share.kind not in SHARE_KINDS:
        raise invalid("share", f"kind must be one of {', '.join(SHARE_KINDS)}.", code="invalid_choice")
    if share.time_slice_class and share.kind != "time_slice":
        raise invalid("share", f"A time-slice class goes with a time_slice share, not a {share.kind} one "
                               "(a MIG slice or a slot has no time slices).", code="class_without_time_slice")
    if share.kind == "time_slice":
        if share.time_slice_class not in TimeSliceClass.values:
            raise invalid("share", f"time_slice_class must be one of {', '.join(TimeSliceClass.values)}.",
                          code="invalid_choice")
        if not 2 <= share.fraction <= MAX_TASKS_PER_GPU:
            raise invalid("share", f"At most {MAX_TASKS_PER_GPU} tasks share a time-sliced GPU: fraction 2 to "
                                   f"{MAX_TASKS_PER_GPU}.", code="too_many_tasks")
    model = GPUModel.objects.filter(slug=share.gpu_model).first()
    if model is None:
        raise invalid("share", f"No GPU model '{share.gpu_model}'.", code="does_not_exist")
    found = Offering.objects.filter(gpu_model=model, is_active=True, **_shape(share)).order_by("kind").first()
    if found is None:
        sold = sorted(Offering.objects.filter(gpu_model=model, is_active=True)
                      .exclude(kind=OfferingKind.BARE_METAL).values_list("slug", flat=True))
        raise invalid("share", f"No {model.name} offering gives a {_words(share)}; on sale: {', '.join(sold)}.",
                      code="share_not_sold")
    return found


def _shape(share: Share) -> dict:
    if share.kind == "gpu":
        return {"kind__in": [OfferingKind.CONTAINER, OfferingKind.VM], "gpus_per_unit": 1, "slots_per_gpu": 1}
    mode = {"mig": IsolationMode.MIG, "slot": IsolationMode.SHARED, "time_slice": IsolationMode.TIME_SLICED}[share.kind]
    return {"kind": OfferingKind.CONTAINER, "isolation_mode": mode, "slots_per_gpu": share.fraction,
            "time_slice_class": share.time_slice_class}


def _words(share: Share) -> str:
    if share.kind == "gpu":
        return "whole GPU"
    what = {"mig": "MIG slice", "slot": "memory-capped slot", "time_slice": f"{share.time_slice_class} time slice"}
    return f"{what[share.kind]} of 1/{share.fraction} GPU"


def check_health_path(path: str) -> str:
    """A path on the replica itself: a URL elsewhere would let the probe reach into other networks."""
    if not path.startswith("/") or path.startswith("//") or "://" in path or "@" in path or "\\" in path:
        raise invalid("health_path", "The health check is a path on the replica's own port, e.g. /healthz: "
                                     "not a URL of another host.", code="health_check_outside")
    return path


def check_regions(slugs: list[str], offering: Offering) -> list[str]:
    """Known regions, each with shared hosts of the offering's GPU model; at least one."""
    if not slugs or len(set(slugs)) != len(slugs):
        raise invalid("regions", "Name one or more regions, each once, home first.", code="invalid")
    known = set(Region.objects.filter(slug__in=slugs).values_list("slug", flat=True))
    if unknown := [s for s in slugs if s not in known]:
        raise invalid("regions", f"No region {', '.join(unknown)}.", code="does_not_exist")
    having = set(Node.objects.filter(region__slug__in=slugs, pool=NodePool.SHARED, gpus__model=offering.gpu_model_id)
                 .values_list("region__slug", flat=True).distinct())
    if not having:
        raise invalid("regions", f"None of {', '.join(slugs)} has {offering.gpu_model.name} GPUs for this share.",
                      code="share_not_in_regions")
    return slugs


def check_scaling(fields: dict) -> None:
    lo, hi = fields["min_replicas"], fields["max_replicas"]
    if lo < 1:
        raise invalid("min_replicas", "An endpoint keeps at least one replica (scale to zero is not offered).",
                      code="min_value")
    if lo > hi:
        raise invalid("min_replicas", f"min_replicas {lo} is more than max_replicas {hi}.", code="min_over_max")
    if fields["scale_in_below"] >= fields["target_utilization"]:
        raise invalid("scale_in_below", "scale_in_below must be under target_utilization, or it would scale in and "
                                        "out in turn.", code="invalid")


@transaction.atomic
def endpoint_create(*, actor, name: str, share: Share, regions: list[str], image: Image | None = None,
                    team=None, environment: dict | None = None, **fields) -> Endpoint:
    """A team's endpoint; its first replicas start at once (inference.replicas, on commit)."""
    if actor.tenant is None:
        raise Forbidden("Endpoints are made inside a tenant; choose one with the X-Meridian-Tenant header.")
    team = team_for(actor, team)
    offering = offering_for(share)
    defaults = {f.name: f.default for f in Endpoint._meta.concrete_fields if f.name in _SCALING}
    scaling = {**defaults, **{k: v for k, v in fields.items() if k in _SCALING}}
    check_scaling(scaling)
    regions = check_regions(regions, offering)
    health_path = check_health_path(fields.get("health_path", "/healthz"))
    if image is not None and image.tenant_id not in (None, actor.tenant.pk):
        raise invalid("image", "Name a public image or one of this tenant's.", code="does_not_exist")
    environment = environment_check(environment or {}, offering)
    taken = Conflict(f"You already have an endpoint named '{name}'.", code="name_taken")
    if Endpoint.objects.filter(tenant=actor.tenant, name=name).exclude(state=EndpointState.DELETED).exists():
        raise taken
    try:
        with transaction.atomic():  # a create racing this one for the name: the constraint decides
            endpoint = Endpoint.objects.create(
                tenant=actor.tenant, team=team, name=name, offering=offering, image=image, regions=regions,
                health_path=health_path, port=fields.get("port", 8000), environment=environment,
                created_by=actor.user, desired_replicas=scaling["min_replicas"], **scaling)
    except IntegrityError as exc:
        raise taken from exc
    audit_record(actor=actor, action="endpoint.create", target=endpoint, after=_audited(endpoint))
    transaction.on_commit(lambda: replicas.converge(endpoint.pk))
    return endpoint


_SCALING = ("min_replicas", "max_replicas", "target_utilization", "scale_in_below", "window_seconds",
            "scale_out_stabilization_seconds", "scale_in_stabilization_seconds", "scale_out_cooldown_seconds",
            "scale_in_cooldown_seconds", "spare_pct", "spare_above", "burst_utilization", "burst_after_seconds")


@transaction.atomic
def endpoint_update(*, actor, endpoint: Endpoint, **fields) -> Endpoint:
    """Change its scaling, regions or health check; the replica count follows on the next pass."""
    locked = Endpoint.objects.select_for_update().get(pk=endpoint.pk)
    if locked.state != EndpointState.ACTIVE:
        raise Conflict(f"Endpoint {locked.name} is {locked.state}.", code="endpoint_not_active")
    before = _audited(locked)
    scaling = {name: fields.get(name, getattr(locked, name)) for name in _SCALING}
    check_scaling(scaling)
    for name, value in scaling.items():
        setattr(locked, name, value)
    if "regions" in fields:
        locked.regions = check_regions(fields["regions"], locked.offering)
    if "health_path" in fields:
        locked.health_path = check_health_path(fields["health_path"])
    locked.desired_replicas = min(max(locked.desired_replicas, locked.min_replicas), locked.max_replicas)
    locked.save()
    audit_record(actor=actor, action="endpoint.update", target=locked, before=before, after=_audited(locked))
    return locked


@transaction.atomic
def endpoint_delete(*, actor, endpoint: Endpoint) -> Endpoint:
    """Out of the load balancer at once; its replicas drain and are released, then it is deleted."""
    locked = Endpoint.objects.select_for_update().get(pk=endpoint.pk)
    if locked.state != EndpointState.ACTIVE:
        return locked
    locked.state = EndpointState.DELETING
    locked.save(update_fields=["state"])
    audit_record(actor=actor, action="endpoint.delete", target=locked)
    transaction.on_commit(lambda: replicas.converge(locked.pk))
    return locked


def _audited(endpoint: Endpoint) -> dict:
    return {name: str(getattr(endpoint, name)) if name == "offering_id" else getattr(endpoint, name)
            for name in AUDITED}
