"""
The image catalogue's services (``cloud.Image``): staff publish public images, a tenant registers
its own; a reservation picks one that fits what it reserves, and its instances boot it (or the
default of their offering's kind). An image in use may be deprecated -- no new reservation takes
it -- but not deleted (409) until nothing live boots it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from django.conf import settings
from django.db import IntegrityError, transaction

from cloud.choices import OfferingKind
from cloud.models import Image, Offering
from core.errors import Conflict, Forbidden, invalid
from provisioning.choices import ReservationState as R
from security.audit import audit_record
from tenants.choices import TenantRole

SHA256 = re.compile(r"^[0-9a-f]{64}$")
CUDA = re.compile(r"^\d{1,2}\.\d{1,2}$")
# What keeps an image in use: reservations that will boot it, or are running it.
LIVE = (R.PENDING, R.QUEUED, R.SCHEDULED, R.PROVISIONING, R.ACTIVE, R.RELEASING)
AUDITED = ["name", "kind", "os", "cuda_version", "architecture", "sha256", "regions", "state", "is_default"]


@dataclass(frozen=True)
class Boot:
    """What an instance boots: the image's reference for the driver, and the user one logs in as."""

    source: str
    login_user: str
    image: Image | None = None


def _cuda(version: str) -> tuple[int, int]:
    major, _, minor = version.partition(".")
    return int(major), int(minor or 0)


@transaction.atomic
def image_register(*, actor, public: bool = False, is_default: bool = False, **fields) -> Image:
    """
    Add an image: public ones (and defaults) by platform admins, a tenant's own by its members.
    400 names a wrong field; 409 when the name is taken where it would live.
    """
    if public or is_default:
        if not actor.is_platform_admin:
            raise Forbidden("Only platform admins publish public images.", code="insufficient_role",
                            required_role="platform_admin")
        tenant_id = None
    else:
        if actor.tenant is None:
            raise Forbidden("A tenant's image belongs to a tenant: choose one (or publish it as public).",
                            code="tenant_required")
        if not actor.has_role(TenantRole.MEMBER):
            raise Forbidden("Members register their tenant's images.", code="insufficient_role",
                            required_role=TenantRole.MEMBER)
        tenant_id = actor.tenant.pk
    sha256 = str(fields.get("sha256", "")).lower()
    if not SHA256.match(sha256):
        raise invalid("sha256", "Give the image's SHA-256 as 64 hex digits.")
    if fields.get("cuda_version") and not CUDA.match(fields["cuda_version"]):
        raise invalid("cuda_version", "Give a CUDA version as major.minor, e.g. 12.8.")
    if is_default:
        Image.objects.filter(kind=fields["kind"], is_default=True).update(is_default=False)
    try:
        with transaction.atomic():
            image = Image.objects.create(tenant_id=tenant_id, is_default=is_default,
                                         **{**fields, "sha256": sha256})
    except IntegrityError:
        raise Conflict(f"An image named {fields.get('name')!r} exists already there; pick another name.",
                       code="image_exists") from None
    audit_record(actor=actor, action="image.register", target=image,
                 after={name: getattr(image, name) for name in AUDITED} | {"public": tenant_id is None})
    return image


def _may_change(actor, image: Image) -> None:
    if actor.is_platform_admin:
        return
    if image.tenant_id is None or not actor.has_role(TenantRole.MEMBER):
        raise Forbidden("Platform admins change public images; members their tenant's own.",
                        code="insufficient_role", required_role=TenantRole.MEMBER)


@transaction.atomic
def image_deprecate(*, actor, image: Image) -> Image:
    """No new reservation takes it; what runs it goes on."""
    _may_change(actor, image)
    if image.state == Image.State.DELETED:
        raise Conflict("The image is deleted.", code="invalid_transition", current_state=image.state)
    Image.objects.filter(pk=image.pk).update(state=Image.State.DEPRECATED, is_default=False)
    audit_record(actor=actor, action="image.deprecate", target=image, before={"state": image.state},
                 after={"state": Image.State.DEPRECATED})
    image.state, image.is_default = Image.State.DEPRECATED, False
    return image


@transaction.atomic
def image_delete(*, actor, image: Image) -> None:
    """Delete an image nothing live boots (409 naming how many reservations still do)."""
    _may_change(actor, image)
    locked = Image.objects.select_for_update().get(pk=image.pk)
    using = locked.reservations.filter(state__in=LIVE).count()
    if using:
        raise Conflict(f"{using} live reservation{'s' if using != 1 else ''} boot{'s' if using == 1 else ''} this "
                       "image; deprecate it instead, or delete it once they end.", code="image_in_use",
                       reservations=using)
    Image.objects.filter(pk=locked.pk).update(state=Image.State.DELETED, is_default=False)
    audit_record(actor=actor, action="image.delete", target=locked, before={"state": locked.state},
                 after={"state": Image.State.DELETED})


def image_check(image: Image, *, offering: Offering, regions) -> None:
    """A 400 on ``image`` when a reservation of ``offering`` in ``regions`` cannot boot it."""
    if image.state != Image.State.ACTIVE:
        raise invalid("image", f"Image {image.name} is {image.get_state_display().lower()}: pick an active one.",
                      code="image_unavailable")
    if image.kind != offering.kind:
        raise invalid("image", f"Image {image.name} is a {image.get_kind_display().lower()} image; "
                               f"{offering.slug} needs a {offering.get_kind_display().lower()} one.",
                      code="image_kind")
    missing = [region.slug for region in regions if region.slug not in image.regions]
    if missing:
        raise invalid("image", f"Image {image.name} is not held in {', '.join(missing)}; it is in "
                               f"{', '.join(image.regions) or 'no region yet'}.", code="image_region")
    limit = offering.gpu_model.max_cuda_version
    if image.cuda_version and limit and _cuda(image.cuda_version) > _cuda(limit):
        raise invalid("image", f"Image {image.name} needs CUDA {image.cuda_version}; the {offering.gpu_model.name}'s "
                               f"driver runs CUDA {limit} at most.", code="image_cuda")


def defaults() -> dict[str, Image]:
    """The default image of each offering kind that has one (one query)."""
    return {image.kind: image for image in Image.objects.filter(is_default=True, state=Image.State.ACTIVE)}


def boot_of(reservation, *, default_images: dict | None = None) -> Boot:
    """What the reservation's instances boot: its image, else the default of its kind, else the settings'."""
    kind = reservation.offering.kind
    image = reservation.image or (defaults() if default_images is None else default_images).get(kind)
    if image is not None:
        return Boot(source=image.source_url, login_user=image.login_user, image=image)
    fallback = {OfferingKind.CONTAINER: settings.MERIDIAN_CONTAINER_IMAGE}.get(kind, settings.MERIDIAN_OS_IMAGE)
    return Boot(source=fallback, login_user="ubuntu")


__all__ = ["Boot", "boot_of", "image_check", "image_delete", "image_deprecate", "image_register"]
