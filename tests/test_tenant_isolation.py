"""
Tenant isolation, walked over every registered API route.

For each tenant-scoped resource, tenant B (its owner, with every right in B) gets 404 on tenant
A's object for every detail operation, never sees it in a list, and cannot create anything that
points at A's objects. Routes that are not tenant-scoped are an explicit allowlist; a route
that is neither fails here, so a view that forgot the tenant base class cannot slip through.
A route added later is covered without editing this file: its model only needs a fixture object
in ``tests/world.make_tenant_objects``.
"""

import uuid

import pytest
from django.forms.models import model_to_dict
from rest_framework.relations import RelatedField

from config.api_router import router
from tenants.models import User
from tenants.scoping import TenantScopedQuerySet
from tests.routes import api_routes
from tests.world import issue_token
from web.api.base import PlatformViewSet, TenantScopedViewSet

# Platform-owned resources: the catalogue and its price book (every tenant reads the same rows), the fleet and what
# attestation trusts (staff only; tenants get 403, proven cell by cell in the role matrix).
PLATFORM_RESOURCES = {"regions", "gpu-models", "offerings", "prices", "spot-prices", "storage-classes", "fabrics",
                      "nodes", "gpus", "trust-anchors", "revocations", "reference-measurements", "reference-manifests",
                      "ocsp-statuses", "attestation-reports"}
# Plain views that are not about a tenant's objects: the caller itself, accepting an invitation
# (scoped by its secret), the audit chain's verification (platform admins only), and the API root
# (the list of resources, the same for everyone).
NOT_TENANT_SCOPED_VIEWS = {"me", "invitation-accept", "audit-chain", "api-root"}

ATTACKER = "t2_owner"
TENANT_RESOURCES = sorted(basename for _, _, basename in router.registry if basename not in PLATFORM_RESOURCES)


def registered(basename):
    return next(viewset for _, viewset, name in router.registry if name == basename)


def a_object(world, model):
    if model is User:
        return world.users["t1_member"]
    assert model in world.t1.objects, (
        f"No fixture object for {model.__name__}: add one to tests/world.make_tenant_objects "
        "so the isolation walk covers its routes."
    )
    return world.t1.objects[model]


def attacker_client(world):
    token = issue_token(world.t2.owner, world.t2.tenant)
    client = world.client("anon")
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


def test_every_route_is_tenant_scoped_or_allowlisted():
    """Each router resource derives from the tenant or platform base class, as its listing says."""
    for _, viewset, basename in router.registry:
        if basename in PLATFORM_RESOURCES:
            assert issubclass(viewset, PlatformViewSet), f"{basename} must be a PlatformViewSet"
        else:
            assert issubclass(viewset, TenantScopedViewSet), f"{basename} must be a TenantScopedViewSet"
    plain = {route.name for route in api_routes() if route.viewset is None}
    assert plain == NOT_TENANT_SCOPED_VIEWS, f"plain API views must be allowlisted here: {plain}"


@pytest.mark.parametrize("basename", TENANT_RESOURCES)
def test_other_tenant_gets_404_and_never_lists_the_object(world, basename):
    """Tenant B lists without A's object and gets 404 on every detail operation on it."""
    viewset = registered(basename)
    model = viewset.queryset.model
    obj = a_object(world, model)
    before = model_to_dict(model.objects.get(pk=obj.pk))
    client = attacker_client(world)

    listed = client.get(f"/api/v1/{_prefix(basename)}/", {"page_size": 200})
    assert listed.status_code in (200, 403), listed.content
    if listed.status_code == 200:
        assert str(public_id(viewset, obj)) not in {str(row["id"]) for row in listed.json()["results"]}

    detail_routes = [r for r in api_routes() if r.viewset is viewset and r.is_detail]
    assert detail_routes, f"{basename} has no detail route to check"
    for route in detail_routes:
        url = _detail_url(basename, route, public_id(viewset, obj))
        response = getattr(client, route.method.lower())(url, {}, format="json")
        assert response.status_code in (404, 403), f"{route.method} {url}: {response.status_code}"
        if response.status_code == 403:
            # Refused by role before any lookup: the same answer for any id, existing or not.
            other = getattr(client, route.method.lower())(_detail_url(basename, route, uuid.uuid4()), {},
                                                          format="json")
            assert other.status_code == 403
        random_id = getattr(client, route.method.lower())(_detail_url(basename, route, uuid.uuid4()), {},
                                                          format="json")
        assert random_id.status_code in (404, 403)
    assert model_to_dict(model.objects.get(pk=obj.pk)) == before, "tenant B changed tenant A's object"


@pytest.mark.parametrize("basename", TENANT_RESOURCES)
def test_other_tenant_cannot_create_pointing_at_a_objects(world, basename):
    """Every related field of a create rejects A's objects as not found, and nothing is written."""
    viewset = registered(basename)
    if not hasattr(viewset, "create"):
        pytest.skip(f"{basename} has no create")
    serializer_class = getattr(viewset, "create_serializer_class", viewset.serializer_class)
    fields = {
        name: field for name, field in serializer_class().fields.items()
        if isinstance(field, RelatedField) and not field.read_only and field.queryset is not None
        and _tenant_owned(field.queryset.model)
    }
    client = attacker_client(world)
    model = viewset.queryset.model
    for name, field in fields.items():
        target = a_object(world, field.queryset.model)  # made first: making it may make objects of ``model``
        count = model.objects.count()
        response = client.post(f"/api/v1/{_prefix(basename)}/", {name: str(target.pk)}, format="json")
        assert response.status_code in (400, 403), f"{basename}.{name}: {response.status_code}"
        if response.status_code == 400:
            errors = {(e["attr"], e["code"]) for e in response.json()["errors"]}
            assert (name, "does_not_exist") in errors, errors
        assert model.objects.count() == count


def _tenant_owned(model):
    return model is User or issubclass(model.objects._queryset_class, TenantScopedQuerySet)


def _prefix(basename):
    return next(prefix for prefix, _, name in router.registry if name == basename)


def _detail_url(basename, route, pk):
    suffix = "" if route.name.endswith("-detail") else route.name.removeprefix(f"{basename}-") + "/"
    return f"/api/v1/{_prefix(basename)}/{pk}/{suffix}"


def public_id(viewset, obj):
    """The id the API shows and looks up (the primary key, or a public UUID beside a sequence)."""
    return getattr(obj, viewset.lookup_field)



@pytest.mark.parametrize("basename", TENANT_RESOURCES)
def test_list_filters_do_not_tell_a_objects_from_missing_ones(world, basename):
    """Filtering a list by A's ids answers exactly as filtering by ids that do not exist."""
    viewset = registered(basename)
    client = attacker_client(world)
    url = f"/api/v1/{_prefix(basename)}/"
    if client.get(url).status_code == 403:
        return  # refused by role before any filtering
    filters = _filter_names(viewset)
    a_ids = {str(getattr(obj, "public_id", obj.pk)) for obj in world.t1.objects.values()}
    a_ids |= {str(world.t1.tenant.pk), str(world.users["t1_member"].pk)}
    for name in filters:
        missing = client.get(url, {name: str(uuid.uuid4())})
        for a_id in a_ids:
            response = client.get(url, {name: a_id})
            assert response.status_code == missing.status_code, f"?{name}={a_id} differs from a missing id"
            if response.status_code == 200:
                assert response.json()["results"] == [] or a_id not in response.content.decode()


def _filter_names(viewset):
    if getattr(viewset, "filterset_class", None):
        return list(viewset.filterset_class.base_filters)
    return list(getattr(viewset, "filterset_fields", []))
