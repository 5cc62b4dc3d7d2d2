"""
Bad input on every write endpoint (ENGINEERING.md (d) and rows 4-5 of (c)): each is a 4xx in the
one JSON error format, writes no row of any tenants/cloud/security model, and a correct request
sent right after still succeeds. Reads: pagination caps, ordering allowlists, long filter values,
unknown URLs and content negotiation.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import quote, urlencode

import pytest
from django.apps import apps
from django.db import transaction

from cloud.choices import NodeState
from cloud.models import Node
from provisioning.models import VPC
from security.models import Incident
from tenants.models import HighPriorityApplication, Membership, Team
from tests.security.staff_bodies import ocsp_body, rim_body
from tests.world import World, hp_snapshot, small_fleet, team_record, unique

ERROR_KEYS = {"code", "detail", "attr"}
# An XML entity bomb: a RIM parser that expanded entities would take gigabytes.
_BILLION_LAUGHS = ('<?xml version="1.0"?><!DOCTYPE l [<!ENTITY a "aaaaaaaaaa">' + "".join(
    f'<!ENTITY {chr(98 + i)} "{("&" + chr(97 + i) + ";") * 10}">' for i in range(8)) +
    ']><SoftwareIdentity xmlns="http://standards.iso.org/iso/19770/-2/2015/schema.xsd">&i;</SoftwareIdentity>')
FIVE_MB = 5 * 1024 * 1024


#
# Helpers
#


@dataclass(frozen=True)
class Raw:
    """A body sent byte for byte, with its own content type."""

    body: bytes
    content_type: str = "application/json"


def row_counts() -> dict[str, int]:
    """Rows of every model of the tenants, cloud, security and provisioning apps."""
    return {
        model._meta.label: model._base_manager.count()
        for app in ("tenants", "cloud", "security", "provisioning")
        for model in apps.get_app_config(app).get_models()
    }


def send(client, method: str, url: str, body=None, **extra):
    if body is None:
        return getattr(client, method)(url, **extra)
    if isinstance(body, Raw):
        return client.generic(method.upper(), url, data=body.body, content_type=body.content_type, **extra)
    return getattr(client, method)(url, data=body, format="json", **extra)


def assert_error(response, status: int, code: str | tuple[str, ...] | None = None, attr: str | None = None) -> dict:
    """``response`` is ``status`` in the one error format, naming ``code`` (and ``attr``) when given."""
    assert response.status_code == status, (response.status_code, response.content[:600])
    assert response["Content-Type"].startswith("application/json"), response["Content-Type"]
    assert b"Traceback" not in response.content
    body = response.json()
    assert set(body) == {"type", "errors"}, body
    assert body["type"] in {"client_error", "validation_error"}, body
    assert isinstance(body["errors"], list) and body["errors"], body
    for error in body["errors"]:
        assert ERROR_KEYS <= set(error) <= ERROR_KEYS | {"meta"}, error
        assert isinstance(error["code"], str) and error["code"], error
        assert isinstance(error["detail"], str) and error["detail"], error
    codes = [error["code"] for error in body["errors"]]
    if code is not None:
        wanted = (code,) if isinstance(code, str) else code
        assert any(c in wanted for c in codes), (wanted, body)
    if attr is not None:
        attrs = [error["attr"] for error in body["errors"]]
        assert any(a == attr or (a or "").startswith(f"{attr}.") for a in attrs), (attr, body)
    return body


@contextmanager
def case(subtests, **params):
    """One bad-input case as a subtest, rolled back afterwards so the next starts from the same rows."""
    with subtests.test(**params):
        savepoint = transaction.savepoint()
        try:
            yield
        finally:
            transaction.savepoint_rollback(savepoint)


def maintainable_node() -> Node:
    if not Node.objects.exists():
        small_fleet(4)
    return Node.objects.filter(state=NodeState.AVAILABLE, is_spare=False).order_by("hostname").first()


#
# The write endpoints, each with a correct request
#


@dataclass(frozen=True)
class Endpoint:
    name: str
    persona: str
    method: str
    path: Callable[[World], str]
    valid: Callable[[World], dict]
    ok: int


def _vpc_body(w: World) -> dict:
    """A VPC beside the world's own (10.20.0.0/24, made here so the overlap cases have it to clash with)."""
    w.t1.objects[VPC]  # noqa: B018 -- made on first use
    return {"name": "training", "region": "us-east-1", "cidr": "10.30.0.0/24", "mtu": 4096, "service_level": 0}


def _ca(**kwargs):
    from security import device_pki

    return device_pki.make_root("Vendor GPU Root CA", **kwargs)[1]


def _pem(cert) -> str:
    from security import device_pki

    return device_pki.cert_to_pem(cert)


def _device_cert() -> str:
    from security import device_pki

    root_key, root = device_pki.make_root("Vendor GPU Root CA")
    return _pem(device_pki.make_device(root_key, root, gpu_uuid="GPU-1", serial="1")[1])


def _membership_path(w: World) -> str:
    return f"/api/v1/memberships/{Membership.objects.get(user=w.users['t1_viewer']).pk}/"


def _hp_apply_body(w: World) -> dict:
    """t1's team with a record that qualifies, its world application withdrawn (one pending at a time)."""
    HighPriorityApplication.objects.filter(team=w.t1.team).update(state="withdrawn")
    team_record(w.t1.team)
    return {"team": str(w.t1.team.pk), "note": "Deadline-bound training runs."}


def _hp_review_path(w: World) -> str:
    """A pending application of a team of its own, untouched by the hp-apply endpoint's setup."""
    team = Team.objects.create(tenant=w.t1.tenant, name="Review", slug=unique("review"))
    application = HighPriorityApplication.objects.create(tenant=w.t1.tenant, team=team, note="Deadline.",
                                                         snapshot=hp_snapshot(eligible=True))
    return f"/api/v1/high-priority-applications/{application.pk}/review/"


def _incident(w: World) -> str:
    return str(w.t1.objects[Incident].pk)


ENDPOINTS = {
    e.name: e
    for e in [
        Endpoint("team-create", "t1_admin", "post", lambda w: "/api/v1/teams/",
                 lambda w: {"name": "Vision", "slug": "vision"}, 201),
        Endpoint("team-update", "t1_admin", "patch", lambda w: f"/api/v1/teams/{w.t1.team.pk}/",
                 lambda w: {"name": "Renamed team"}, 200),
        Endpoint("token-create", "t1_member", "post", lambda w: "/api/v1/api-tokens/",
                 lambda w: {"name": "ci", "scope": "read", "expires_in_days": 30}, 201),
        Endpoint("invitation-create", "t1_admin", "post", lambda w: "/api/v1/invitations/",
                 lambda w: {"role": "member", "email": "new-person@example.com"}, 201),
        Endpoint("membership-update", "t1_owner", "patch", _membership_path, lambda w: {"role": "member"}, 200),
        Endpoint("team-membership-create", "t1_admin", "post", lambda w: "/api/v1/team-memberships/",
                 lambda w: {"team": str(w.t1.team.pk), "user": str(w.users["t1_viewer"].pk), "role": "member"},
                 201),
        Endpoint("quota-create", "platform_admin", "post", lambda w: "/api/v1/quotas/",
                 lambda w: {"tenant": str(w.t1.tenant.pk), "resource": "vpcs", "limit": 4}, 201),
        Endpoint("offering-create", "platform_admin", "post", lambda w: "/api/v1/offerings/",
                 lambda w: {"slug": "h100-vm-1x", "name": "H100 VM 1x", "kind": "vm", "gpu_model": "h100-80gb-sxm",
                            "gpus_per_unit": 1, "price_per_gpu_hour": "2.4900"}, 201),
        Endpoint("region-create", "platform_admin", "post", lambda w: "/api/v1/regions/",
                 lambda w: {"slug": "eu-central-9", "name": "EU Central 9"}, 201),
        Endpoint("gpu-model-create", "platform_admin", "post", lambda w: "/api/v1/gpu-models/",
                 lambda w: {"slug": "l40s-48gb", "name": "NVIDIA L40S", "memory_gib": 48,
                            "memory_bandwidth_tbs": "0.86", "fp16_tflops": "362.0", "tdp_watts": 350}, 201),
        Endpoint("node-maintenance", "platform_admin", "post",
                 lambda w: f"/api/v1/nodes/{maintainable_node().pk}/maintenance/",
                 lambda w: {"reason": "firmware update"}, 200),
        Endpoint("vpc-create", "t1_member", "post", lambda w: "/api/v1/vpcs/", _vpc_body, 201),
        Endpoint("trust-anchor-create", "platform_admin", "post", lambda w: "/api/v1/trust-anchors/",
                 lambda w: {"name": "Vendor root", "certificate_pem": _pem(_ca())}, 201),
        Endpoint("revocation-create", "platform_admin", "post", lambda w: "/api/v1/revocations/",
                 lambda w: {"issuer": "CN=Vendor GPU CA", "serial_number": "1f2e3d", "reason": "key compromise"}, 201),
        Endpoint("reference-create", "platform_admin", "post", lambda w: "/api/v1/reference-measurements/",
                 lambda w: {"gpu_model": "h100-80gb-sxm", "vbios_version": "96.00.aa.00.01", "driver_version": "575.1",
                            "measurements": {"0": "a" * 96, "1": "b" * 96}}, 201),
        Endpoint("rim-import", "platform_admin", "post", lambda w: "/api/v1/reference-manifests/",
                 lambda w: rim_body(), 201),
        Endpoint("ocsp-import", "platform_admin", "post", lambda w: "/api/v1/ocsp-statuses/",
                 lambda w: ocsp_body(), 201),
        Endpoint("hp-apply", "t1_member", "post", lambda w: "/api/v1/high-priority-applications/", _hp_apply_body,
                 201),
        Endpoint("hp-review", "platform_approver", "post", _hp_review_path,
                 lambda w: {"decision": "approve", "note": "The record qualifies."}, 200),
        Endpoint("incident-assign", "platform_admin", "post", lambda w: f"/api/v1/incidents/{_incident(w)}/assign/",
                 lambda w: {"assignee": w.users["platform_admin"].email}, 200),
        Endpoint("incident-resolve", "platform_admin", "post",
                 lambda w: f"/api/v1/incidents/{_incident(w)}/resolve/", lambda w: {"note": "Reseated the GPU."},
                 200),
    ]
}



def _other_team(w: World) -> str:
    return str(w.t2.team.pk)


# (case id, body from (world, valid payload), status, code or codes or None, attr or None)
COMMON_CASES = [
    ("unknown-field", lambda w, v: {**v, "colour": "red"}, 400, "unknown_field", "colour"),
    ("malformed-json", lambda w, v: Raw(b'{"name": '), 400, "parse_error", None),
    ("nan-literal", lambda w, v: Raw(b'{"name": NaN}'), 400, "parse_error", None),
    ("json-null", lambda w, v: Raw(b"null"), 400, None, None),
    ("json-array", lambda w, v: [v], 400, None, None),
    ("json-string", lambda w, v: Raw(b'"name"'), 400, None, None),
    ("text-plain", lambda w, v: Raw(json.dumps(v).encode(), "text/plain"), 415, "unsupported_media_type", None),
    ("form-encoded", lambda w, v: Raw(urlencode(v).encode(), "application/x-www-form-urlencoded"), 415,
     "unsupported_media_type", None),
    ("body-5mb", lambda w, v: Raw(json.dumps({**v, "pad": "x" * FIVE_MB}).encode()), 413, "request_too_large",
     None),
    ("body-just-over-1mb", lambda w, v: Raw(json.dumps({**v, "pad": "x" * 1_000_000}).encode()), 413,
     "request_too_large", None),
]

LONG = "x" * 10 * 1024
NUL = "vis\x00ion"


def _string_cases(field: str, *, choice: bool = False) -> list:
    long_code = "invalid_choice" if choice else "max_length"
    nul_code = "invalid_choice" if choice else "null_characters_not_allowed"
    return [
        (f"{field}-10kb", lambda w, v: {**v, field: LONG}, 400, long_code, field),
        (f"{field}-nul", lambda w, v: {**v, field: NUL}, 400, nul_code, field),
        (f"{field}-list", lambda w, v: {**v, field: ["a", "b"]}, 400, None, field),
        (f"{field}-object", lambda w, v: {**v, field: {"a": 1}}, 400, None, field),
    ]


def _read_only(*fields: str) -> list:
    return [(f"read-only-{f}", lambda w, v, f=f: {**v, f: str(uuid.uuid4())}, 400, "read_only", f) for f in fields]


def _not_accepted(*fields: str) -> list:
    """Fields of the answer that a create does not take (its input is its own serializer)."""
    return [(f"not-accepted-{f}", lambda w, v, f=f: {**v, f: str(uuid.uuid4())}, 400, ("read_only", "unknown_field"),
             f) for f in fields]


def _case(case_id, body, status=400, code=None, attr=None):
    return (case_id, body, status, code, attr)


SPECIFIC_CASES = {
    "team-create": [
        *_string_cases("name"),
        _case("slug-path", lambda w, v: {**v, "slug": "../etc"}, code="invalid", attr="slug"),
        _case("slug-sql", lambda w, v: {**v, "slug": "1 OR 1=1"}, code="invalid", attr="slug"),
        _case("name-empty", lambda w, v: {**v, "name": ""}, code="blank", attr="name"),
        _case("slug-missing", lambda w, v: {"name": v["name"]}, code="required", attr="slug"),
        _case("tenant-field", lambda w, v: {**v, "tenant": str(w.t2.tenant.pk)}, code=("read_only", "unknown_field"),
              attr="tenant"),
        *_read_only("id", "created_at"),
    ],
    "team-update": [
        *_string_cases("name"),
        _case("slug-object", lambda w, v: {"slug": {"a": 1}}, attr="slug"),
        _case("tenant-field", lambda w, v: {"tenant": str(w.t2.tenant.pk)}, code=("read_only", "unknown_field"),
              attr="tenant"),
        *_read_only("id", "created_at"),
    ],
    "token-create": [
        *_string_cases("name"),
        _case("scope-superuser", lambda w, v: {**v, "scope": "superuser"}, code="invalid_choice", attr="scope"),
        _case("expires-negative", lambda w, v: {**v, "expires_in_days": -1}, code="min_value", attr="expires_in_days"),
        _case("expires-huge", lambda w, v: {**v, "expires_in_days": 10**12}, code="max_value",
              attr="expires_in_days"),
        _case("expires-string", lambda w, v: {**v, "expires_in_days": "soon"}, code="invalid",
              attr="expires_in_days"),
        _case("expires-ten-years", lambda w, v: {**v, "expires_in_days": 3650}, attr="expires_in_days"),
        _case("expires-at-garbage", lambda w, v: {"name": "ci", "expires_at": "2030-02-30T00:00Z"}, code="invalid",
              attr="expires_at"),
        _case("team-other-tenant", lambda w, v: {**v, "team": _other_team(w)}, code="does_not_exist", attr="team"),
        _case("team-object", lambda w, v: {**v, "team": {"id": str(w.t1.team.pk)}}, attr="team"),
        _case("tenant-field", lambda w, v: {**v, "tenant": str(w.t2.tenant.pk)}, code=("read_only", "unknown_field"),
              attr="tenant"),
        *_read_only("id", "created_at", "user", "revoked_at", "last_used_at", "display"),
    ],
    "invitation-create": [
        *_string_cases("email"),
        _case("role-superuser", lambda w, v: {**v, "role": "superuser"}, code="invalid_choice", attr="role"),
        _case("team-role-superuser", lambda w, v: {**v, "team_role": "superuser"}, code="invalid_choice",
              attr="team_role"),
        _case("team-other-tenant", lambda w, v: {**v, "team": _other_team(w)}, code="does_not_exist", attr="team"),
        _case("team-not-uuid", lambda w, v: {**v, "team": "1 OR 1=1"}, attr="team"),
        *_read_only("id", "created_at", "status", "expires_at"),
    ],
    "membership-update": [
        *_string_cases("role", choice=True),
        _case("role-superuser", lambda w, v: {"role": "superuser"}, code="invalid_choice", attr="role"),
        _case("role-bool", lambda w, v: {"role": True}, code="invalid_choice", attr="role"),
        _case("tenant-field", lambda w, v: {**v, "tenant": str(w.t2.tenant.pk)}, code=("read_only", "unknown_field"),
              attr="tenant"),
        *_read_only("id", "created_at", "user", "email"),
    ],
    "team-membership-create": [
        *_string_cases("role", choice=True),
        _case("role-superuser", lambda w, v: {**v, "role": "superuser"}, code="invalid_choice", attr="role"),
        _case("user-object", lambda w, v: {**v, "user": {"id": v["user"]}}, attr="user"),
        _case("user-unknown", lambda w, v: {**v, "user": str(uuid.uuid4())}, code="does_not_exist", attr="user"),
        _case("user-other-tenant", lambda w, v: {**v, "user": str(w.users["t2_member"].pk)}, code="does_not_exist",
              attr="user"),
        _case("team-other-tenant", lambda w, v: {**v, "team": _other_team(w)}, code="does_not_exist", attr="team"),
        _case("team-not-uuid", lambda w, v: {**v, "team": "../"}, attr="team"),
        *_read_only("id", "created_at", "email"),
    ],
    "quota-create": [
        *_string_cases("resource", choice=True),
        _case("limit-negative", lambda w, v: {**v, "limit": -1}, code="min_value", attr="limit"),
        _case("limit-huge", lambda w, v: {**v, "limit": 10**12}, code="max_value", attr="limit"),
        _case("limit-string", lambda w, v: {**v, "limit": "lots"}, code="invalid", attr="limit"),
        _case("limit-fraction", lambda w, v: {**v, "limit": 1.5}, code="invalid", attr="limit"),
        _case("limit-bool", lambda w, v: {**v, "limit": True}, code="invalid", attr="limit"),
        _case("limit-list", lambda w, v: {**v, "limit": [4]}, attr="limit"),
        _case("resource-superuser", lambda w, v: {**v, "resource": "superuser"}, code="invalid_choice",
              attr="resource"),
        _case("gpu-model-unknown", lambda w, v: {**v, "resource": "gpus", "gpu_model": "no-such-gpu"},
              code="does_not_exist", attr="gpu_model"),
        _case("gpu-model-on-vpcs", lambda w, v: {**v, "gpu_model": "h100-80gb-sxm"}, attr="gpu_model"),
        _case("team-of-other-tenant", lambda w, v: {**v, "team": _other_team(w)}, attr="team"),
        _case("tenant-unknown", lambda w, v: {**v, "tenant": str(uuid.uuid4())}, code="does_not_exist",
              attr="tenant"),
        *_read_only("id", "updated_at"),
    ],
    "offering-create": [
        *_string_cases("name"),
        _case("gpus-per-unit-zero", lambda w, v: {**v, "gpus_per_unit": 0}, code="min_value", attr="gpus_per_unit"),
        _case("gpus-per-unit-seventeen", lambda w, v: {**v, "gpus_per_unit": 17}, code="max_value",
              attr="gpus_per_unit"),
        _case("gpus-per-unit-huge", lambda w, v: {**v, "gpus_per_unit": 10**30}, code="max_value",
              attr="gpus_per_unit"),
        _case("gpus-per-unit-string", lambda w, v: {**v, "gpus_per_unit": "eight"}, code="invalid",
              attr="gpus_per_unit"),
        _case("price-negative", lambda w, v: {**v, "price_per_gpu_hour": -1}, code="min_value",
              attr="price_per_gpu_hour"),
        _case("price-huge", lambda w, v: {**v, "price_per_gpu_hour": 10**12}, attr="price_per_gpu_hour"),
        _case("price-string", lambda w, v: {**v, "price_per_gpu_hour": "free"}, code="invalid",
              attr="price_per_gpu_hour"),
        _case("price-nan", lambda w, v: {**v, "price_per_gpu_hour": "NaN"}, code="invalid",
              attr="price_per_gpu_hour"),
        _case("price-1e400", lambda w, v: {**v, "price_per_gpu_hour": "1e400"}, attr="price_per_gpu_hour"),
        _case("spot-floor-above-price", lambda w, v: {**v, "spot_available": True, "spot_floor_price": "9.0000"},
              attr="spot_floor_price"),
        _case("kind-superuser", lambda w, v: {**v, "kind": "superuser"}, code="invalid_choice", attr="kind"),
        _case("isolation-superuser", lambda w, v: {**v, "isolation_mode": "superuser"}, code="invalid_choice",
              attr="isolation_mode"),
        _case("spot-object", lambda w, v: {**v, "spot_available": {"yes": True}}, code="invalid",
              attr="spot_available"),
        _case("spot-without-floor", lambda w, v: {**v, "spot_available": True}, attr="spot_floor_price"),
        _case("no-show-grace-negative", lambda w, v: {**v, "no_show_grace_minutes": -1}, code="min_value",
              attr="no_show_grace_minutes"),
        _case("no-show-grace-a-day", lambda w, v: {**v, "no_show_grace_minutes": 1440}, code="max_value",
              attr="no_show_grace_minutes"),
        _case("no-show-warning-zero", lambda w, v: {**v, "no_show_warning_minutes": 0}, code="min_value",
              attr="no_show_warning_minutes"),
        _case("release-grace-string", lambda w, v: {**v, "release_grace_minutes": "soon"}, code="invalid",
              attr="release_grace_minutes"),
        _case("gpu-model-unknown", lambda w, v: {**v, "gpu_model": "no-such-gpu"}, code="does_not_exist",
              attr="gpu_model"),
        _case("bare-metal-slots", lambda w, v: {**v, "kind": "bare_metal", "gpus_per_unit": 4, "slots_per_gpu": 2}),
        _case("confidential-container", lambda w, v: {**v, "kind": "container", "confidential": True}),
        _case("slug-nul", lambda w, v: {**v, "slug": "h100\x00vm"}, attr="slug"),
        *_read_only("id", "created_at", "availability", "reserved_price_per_gpu_hour"),
    ],
    "region-create": [
        *_string_cases("name"),
        _case("slug-path", lambda w, v: {**v, "slug": "../etc"}, code="invalid", attr="slug"),
        _case("slug-10kb", lambda w, v: {**v, "slug": LONG}, attr="slug"),
        _case("is-active-object", lambda w, v: {**v, "is_active": {"a": 1}}, code="invalid", attr="is_active"),
        _case("is-active-maybe", lambda w, v: {**v, "is_active": "maybe"}, code="invalid", attr="is_active"),
        *_read_only("id", "created_at"),
    ],
    "gpu-model-create": [
        *_string_cases("name"),
        _case("memory-negative", lambda w, v: {**v, "memory_gib": -1}, code="min_value", attr="memory_gib"),
        _case("memory-huge", lambda w, v: {**v, "memory_gib": 10**12}, code="max_value", attr="memory_gib"),
        _case("memory-string", lambda w, v: {**v, "memory_gib": "big"}, code="invalid", attr="memory_gib"),
        _case("tdp-negative", lambda w, v: {**v, "tdp_watts": -5}, code="min_value", attr="tdp_watts"),
        _case("mig-65", lambda w, v: {**v, "mig_max_instances": 65}, code="max_value", attr="mig_max_instances"),
        _case("bandwidth-string", lambda w, v: {**v, "memory_bandwidth_tbs": "fast"}, code="invalid",
              attr="memory_bandwidth_tbs"),
        *_read_only("id", "supports_mig"),
    ],
    "vpc-create": [
        *_string_cases("name"),
        _case("name-spaces", lambda w, v: {**v, "name": "My VPC"}, code="invalid", attr="name"),
        _case("name-dash-first", lambda w, v: {**v, "name": "-vpc"}, code="invalid", attr="name"),
        _case("name-taken", lambda w, v: {**v, "name": w.t1.objects[VPC].name}, 409, "name_taken"),
        _case("region-unknown", lambda w, v: {**v, "region": "mars-1"}, code="does_not_exist", attr="region"),
        _case("fabric-unknown", lambda w, v: {**v, "fabric": "no-such-fabric"}, attr="fabric"),
        _case("pkey-zero", lambda w, v: {**v, "pkey": 0}, code="pkey_out_of_range", attr="pkey"),
        _case("pkey-default", lambda w, v: {**v, "pkey": "0x7fff"}, code="pkey_out_of_range", attr="pkey"),
        _case("pkey-full-bit", lambda w, v: {**v, "pkey": 0x8001}, code="pkey_out_of_range", attr="pkey"),
        _case("pkey-negative", lambda w, v: {**v, "pkey": -1}, code="pkey_out_of_range", attr="pkey"),
        _case("pkey-garbage", lambda w, v: {**v, "pkey": "0xzz"}, code="invalid", attr="pkey"),
        _case("pkey-bool", lambda w, v: {**v, "pkey": True}, code="invalid", attr="pkey"),
        _case("pkey-fraction", lambda w, v: {**v, "pkey": 1.5}, code="invalid", attr="pkey"),
        _case("pkey-taken", lambda w, v: {**v, "pkey": w.t1.objects[VPC].pkey}, 409, "pkey_unavailable"),
        _case("cidr-overlap", lambda w, v: {**v, "cidr": "10.20.0.128/25"}, 409, "cidr_overlap"),
        _case("cidr-contains-another", lambda w, v: {**v, "cidr": "10.20.0.0/16"}, 409, "cidr_overlap"),
        _case("cidr-too-small", lambda w, v: {**v, "cidr": "10.30.0.0/30"}, code="cidr_size", attr="cidr"),
        _case("cidr-too-large", lambda w, v: {**v, "cidr": "10.0.0.0/8"}, code="cidr_size", attr="cidr"),
        _case("cidr-host-bits", lambda w, v: {**v, "cidr": "10.30.0.1/24"}, code="cidr_not_network", attr="cidr"),
        _case("cidr-public", lambda w, v: {**v, "cidr": "8.8.8.0/24"}, code="cidr_not_private", attr="cidr"),
        _case("cidr-loopback", lambda w, v: {**v, "cidr": "127.0.0.0/16"}, code="cidr_not_private", attr="cidr"),
        _case("cidr-link-local", lambda w, v: {**v, "cidr": "169.254.0.0/16"}, code="cidr_not_private", attr="cidr"),
        _case("name-reserved", lambda w, v: {**v, "name": "default-us-east-1-ib-a"}, code="name_reserved",
              attr="name"),
        _case("cidr-garbage", lambda w, v: {**v, "cidr": "10.30.0.0/abc"}, code="cidr_invalid", attr="cidr"),
        _case("cidr-ipv6", lambda w, v: {**v, "cidr": "fd00::/64"}, code="cidr_invalid", attr="cidr"),
        _case("mtu-1500", lambda w, v: {**v, "mtu": 1500}, code="invalid_choice", attr="mtu"),
        _case("sl-16", lambda w, v: {**v, "service_level": 16}, code="max_value", attr="service_level"),
        _case("sl-string", lambda w, v: {**v, "service_level": "gold"}, code="invalid", attr="service_level"),
        _case("rate-not-ib", lambda w, v: {**v, "rate_gbps": 7}, code="rate_invalid", attr="rate_gbps"),
        _case("team-other-tenant", lambda w, v: {**v, "team": _other_team(w)}, code="does_not_exist", attr="team"),
        _case("tenant-field", lambda w, v: {**v, "tenant": str(w.t2.tenant.pk)}, code="unknown_field",
              attr="tenant"),
        _case("state-field", lambda w, v: {**v, "state": "active"}, code="unknown_field", attr="state"),
        _case("is-default-field", lambda w, v: {**v, "is_default": True}, code="unknown_field", attr="is_default"),
    ],
    "trust-anchor-create": [
        *_string_cases("name"),
        _case("pem-garbage", lambda w, v: {**v, "certificate_pem": "-----BEGIN CERTIFICATE-----\nnope\n"},
              code="invalid_certificate", attr="certificate_pem"),
        _case("pem-not-a-ca", lambda w, v: {**v, "certificate_pem": _device_cert()}, code="not_a_ca",
              attr="certificate_pem"),
        _case("pem-expired", lambda w, v: {**v, "certificate_pem": _pem(_ca(
            not_before=datetime(2020, 1, 1, tzinfo=UTC), not_after=datetime(2021, 1, 1, tzinfo=UTC)))},
              code="expired", attr="certificate_pem"),
        _case("pem-20kb", lambda w, v: {**v, "certificate_pem": "A" * 20_000}, code="max_length",
              attr="certificate_pem"),
        _case("kind-superuser", lambda w, v: {**v, "kind": "superuser"}, code="invalid_choice", attr="kind"),
        _case("pem-missing", lambda w, v: {"name": "x"}, code="required", attr="certificate_pem"),
        *_not_accepted("id", "fingerprint_sha256"),
    ],
    "revocation-create": [
        *_string_cases("issuer"),
        _case("serial-not-hex", lambda w, v: {**v, "serial_number": "xyz"}, code="invalid", attr="serial_number"),
        _case("serial-huge", lambda w, v: {**v, "serial_number": "f" * 100}, attr="serial_number"),
        _case("serial-missing", lambda w, v: {"issuer": "CN=x"}, code="required", attr="serial_number"),
        *_not_accepted("id", "revoked_at"),
    ],
    "reference-create": [
        _case("model-unknown", lambda w, v: {**v, "gpu_model": "no-such-gpu"}, code="does_not_exist",
              attr="gpu_model"),
        _case("vbios-spaces", lambda w, v: {**v, "vbios_version": "96 00"}, code="invalid", attr="vbios_version"),
        _case("vbios-10kb", lambda w, v: {**v, "vbios_version": LONG}, attr="vbios_version"),
        _case("digest-short", lambda w, v: {**v, "measurements": {"0": "abc"}}, code="invalid", attr="measurements"),
        _case("digest-not-hex", lambda w, v: {**v, "measurements": {"0": "z" * 96}}, code="invalid",
              attr="measurements"),
        _case("index-not-numeric", lambda w, v: {**v, "measurements": {"first": "a" * 96}}, code="invalid",
              attr="measurements"),
        _case("measurements-empty", lambda w, v: {**v, "measurements": {}}, attr="measurements"),
        _case("measurements-list", lambda w, v: {**v, "measurements": ["a" * 96]}, attr="measurements"),
        _case("measurements-65", lambda w, v: {**v, "measurements": {str(i): "a" * 96 for i in range(65)}},
              attr="measurements"),
        *_not_accepted("id", "created_at", "registered_by_id"),
    ],
    "rim-import": [
        _case("document-missing", lambda w, v: {}, code="required", attr="document"),
        _case("document-not-xml", lambda w, v: {"document": "hello"}, code="rim_invalid", attr="document"),
        _case("document-tampered", lambda w, v: {"document": v["document"].replace("a" * 96, "c" * 96)},
              code="rim_invalid", attr="document"),
        _case("entity-expansion", lambda w, v: {"document": _BILLION_LAUGHS}, code="rim_invalid", attr="document"),
        _case("document-600kb", lambda w, v: {"document": "A" * 600_000}, code="max_length",
              attr="document"),
        *_not_accepted("id", "kind", "version"),
    ],
    "ocsp-import": [
        _case("response-missing", lambda w, v: {}, code="required", attr="response"),
        _case("response-not-base64", lambda w, v: {"response": "@@@"}, code="invalid", attr="response"),
        _case("response-not-ocsp", lambda w, v: {"response": "aGVsbG8="}, code="ocsp_invalid", attr="response"),
        _case("issuer-not-pem", lambda w, v: {**v, "issuers": ["x"]}, code="invalid", attr="issuers"),
        _case("issuers-5", lambda w, v: {**v, "issuers": [_pem(_ca())] * 5}, code="max_length", attr="issuers"),
        *_not_accepted("id", "status"),
    ],
    "hp-apply": [
        *_string_cases("note"),
        *_string_cases("override_note"),
        _case("note-missing", lambda w, v: {"team": v["team"]}, code="required", attr="note"),
        _case("note-blank", lambda w, v: {**v, "note": ""}, code="blank", attr="note"),
        _case("team-missing", lambda w, v: {"note": v["note"]}, code="required", attr="team"),
        _case("team-other-tenant", lambda w, v: {**v, "team": _other_team(w)}, code="does_not_exist", attr="team"),
        _case("team-not-uuid", lambda w, v: {**v, "team": "1 OR 1=1"}, attr="team"),
        _case("team-object", lambda w, v: {**v, "team": {"id": v["team"]}}, attr="team"),
        _case("override-by-member", lambda w, v: {**v, "override_note": "Trust me."}, 403, "hp_override_not_allowed"),
        _case("tenant-field", lambda w, v: {**v, "tenant": str(w.t2.tenant.pk)}, code="unknown_field", attr="tenant"),
        _case("state-field", lambda w, v: {**v, "state": "approved"}, code="unknown_field", attr="state"),
        _case("snapshot-field", lambda w, v: {**v, "snapshot": {"eligible": True}}, code="unknown_field",
              attr="snapshot"),
        *_not_accepted("id", "created_at", "expires_at", "reviewed_by"),
    ],
    "hp-review": [
        *_string_cases("note"),
        *_string_cases("decision", choice=True),
        _case("decision-maybe", lambda w, v: {**v, "decision": "maybe"}, code="invalid_choice", attr="decision"),
        _case("decision-bool", lambda w, v: {**v, "decision": True}, code="invalid_choice", attr="decision"),
        _case("decision-missing", lambda w, v: {"note": v["note"]}, code="required", attr="decision"),
        _case("note-missing", lambda w, v: {"decision": "approve"}, code="required", attr="note"),
        _case("note-blank", lambda w, v: {**v, "note": "   "}, code="blank", attr="note"),
        _case("state-field", lambda w, v: {**v, "state": "approved"}, code="unknown_field", attr="state"),
        _case("expires-field", lambda w, v: {**v, "expires_at": "2099-01-01T00:00:00Z"}, code="unknown_field",
              attr="expires_at"),
    ],
    "incident-assign": [
        *_string_cases("assignee"),
        _case("assignee-missing", lambda w, v: {}, code="required", attr="assignee"),
        _case("assignee-unknown", lambda w, v: {"assignee": "nobody@example.com"}, code="does_not_exist",
              attr="assignee"),
        _case("assignee-random-id", lambda w, v: {"assignee": str(uuid.uuid4())}, code="does_not_exist",
              attr="assignee"),
        _case("assignee-tenant-user", lambda w, v: {"assignee": w.users["t1_owner"].email}, code="not_staff",
              attr="assignee"),
        _case("assignee-approver", lambda w, v: {"assignee": str(w.users["platform_approver"].pk)},
              code="not_staff", attr="assignee"),
        _case("assignee-number", lambda w, v: {"assignee": 7}, attr="assignee"),
        _case("state-field", lambda w, v: {**v, "resolved_at": "2030-01-01T00:00:00Z"}, code="unknown_field",
              attr="resolved_at"),
    ],
    "incident-resolve": [
        *_string_cases("note"),
        _case("note-missing", lambda w, v: {}, code="required", attr="note"),
        _case("note-blank", lambda w, v: {"note": "   "}, code="blank", attr="note"),
        _case("resolved-by-field", lambda w, v: {**v, "resolved_by": str(w.users["t1_owner"].pk)},
              code="unknown_field", attr="resolved_by"),
    ],
    "node-maintenance": [
        *_string_cases("reason"),
        _case("reason-missing", lambda w, v: {}, code="required", attr="reason"),
        _case("reason-blank", lambda w, v: {"reason": ""}, code="blank", attr="reason"),
        _case("state-field", lambda w, v: {**v, "state": "available"}, code="unknown_field", attr="state"),
        _case("id-field", lambda w, v: {**v, "id": str(uuid.uuid4())}, code="unknown_field", attr="id"),
    ],
}


@pytest.mark.parametrize("endpoint", list(ENDPOINTS))
def test_bad_write_is_a_clean_4xx_that_writes_nothing(world, subtests, endpoint):
    """Each bad body is refused in the error format, nothing is written, and a correct request then succeeds."""
    ep = ENDPOINTS[endpoint]
    url, valid = ep.path(world), ep.valid(world)
    client = world.client(ep.persona)
    for case_id, make_body, status, code, attr in COMMON_CASES + SPECIFIC_CASES[endpoint]:
        with case(subtests, case=case_id):
            before = row_counts()

            response = send(client, ep.method, url, make_body(world, valid))

            assert_error(response, status, code, attr)
            assert row_counts() == before
            ok = send(client, ep.method, url, valid)
            assert ok.status_code == ep.ok, ok.content[:600]


def test_deeply_nested_json_is_a_400_not_a_500(world, subtests):
    """JSON nested 100,000 deep (400 kB, under the size limit) is a parse error on every write endpoint."""
    body = Raw(b"[" * 100_000 + b"]" * 100_000)
    for ep in ENDPOINTS.values():
        url, valid = ep.path(world), ep.valid(world)
        client = world.client(ep.persona)
        with case(subtests, endpoint=ep.name):
            before = row_counts()

            response = send(client, ep.method, url, body)

            assert_error(response, 400, "parse_error")
            assert row_counts() == before
            assert send(client, ep.method, url, valid).status_code == ep.ok


@pytest.mark.parametrize("endpoint", list(ENDPOINTS))
def test_correct_write_succeeds_and_writes(world, endpoint):
    """The control: each endpoint's correct request succeeds and changes the database."""
    ep = ENDPOINTS[endpoint]
    url, valid = ep.path(world), ep.valid(world)
    before = row_counts()

    response = send(world.client(ep.persona), ep.method, url, valid)

    assert response.status_code == ep.ok, response.content[:600]
    assert row_counts() != before


@pytest.mark.parametrize("endpoint", list(ENDPOINTS))
def test_not_acceptable_write_writes_nothing(world, endpoint):
    """Asking for XML on a write is a 406 before anything is written."""
    ep = ENDPOINTS[endpoint]
    url, valid = ep.path(world), ep.valid(world)
    client = world.client(ep.persona)
    before = row_counts()

    response = send(client, ep.method, url, valid, HTTP_ACCEPT="application/xml")

    assert_error(response, 406, "not_acceptable")
    assert row_counts() == before
    assert send(client, ep.method, url, valid).status_code == ep.ok


#
# Ids in the path
#

ID_ROUTES = {
    "team-update": ("t1_admin", "patch", "/api/v1/teams/{}/", {"name": "Renamed"}),
    "membership-update": ("t1_owner", "patch", "/api/v1/memberships/{}/", {"role": "member"}),
    "node-maintenance": ("platform_admin", "post", "/api/v1/nodes/{}/maintenance/", {"reason": "firmware"}),
    "team-membership-update": ("t1_admin", "patch", "/api/v1/team-memberships/{}/", {"role": "member"}),
    "quota-update": ("platform_admin", "patch", "/api/v1/quotas/{}/", {"limit": 8}),
    "token-revoke": ("t1_owner", "delete", "/api/v1/api-tokens/{}/", None),
    "hp-withdraw": ("t1_member", "post", "/api/v1/high-priority-applications/{}/withdraw/", None),
    "hp-review": ("platform_approver", "post", "/api/v1/high-priority-applications/{}/review/",
                  {"decision": "approve", "note": "The record qualifies."}),
    "notification-read": ("t1_member", "post", "/api/v1/notifications/{}/read/", None),
    "incident-acknowledge": ("platform_admin", "post", "/api/v1/incidents/{}/acknowledge/", None),
    "incident-resolve": ("platform_admin", "post", "/api/v1/incidents/{}/resolve/", {"note": "Done."}),
}
BAD_SEGMENTS = ["..", "../", "1 OR 1=1", "%00", "1;DROP TABLE tenants_team", "%2e%2e%2f", "0" * 5000,
                "00000000-0000-0000-0000-00000000000g"]


@pytest.mark.parametrize("route", list(ID_ROUTES))
def test_unknown_uuid_in_path_is_404(world, route):
    """A well-formed id that names nothing is a JSON 404 and writes nothing."""
    persona, method, template, body = ID_ROUTES[route]
    maintainable_node()
    before = row_counts()

    response = send(world.client(persona), method, template.format(uuid.uuid4()), body)

    assert_error(response, 404, "not_found")
    assert row_counts() == before


@pytest.mark.parametrize("route", list(ID_ROUTES))
def test_non_uuid_path_segment_is_json_404(world, subtests, route):
    """Traversal, SQL and NUL bytes in the id segment are a JSON 404, never a 500, and write nothing."""
    persona, method, template, body = ID_ROUTES[route]
    maintainable_node()
    client = world.client(persona)
    for segment in BAD_SEGMENTS:
        with case(subtests, segment=segment[:40]):
            before = row_counts()

            response = send(client, method, template.format(segment if "%" in segment else quote(segment)), body)

            assert_error(response, 404, "not_found")
            assert row_counts() == before


def test_other_tenants_object_in_path_is_404(world):
    """Tenant A patching tenant B's team is told it does not exist; the team is unchanged."""
    team = world.t2.team
    before = row_counts()

    response = send(world.client("t1_admin"), "patch", f"/api/v1/teams/{team.pk}/", {"name": "Stolen"})

    assert_error(response, 404, "not_found")
    assert row_counts() == before
    team.refresh_from_db()
    assert team.name != "Stolen"


UNKNOWN_URLS = [
    ("get", "/api/v1/does-not-exist/"),
    ("post", "/api/v1/does-not-exist/"),
    ("get", "/api/v2/teams/"),
    ("get", "/api/"),
    ("get", "/api/v1/teams/extra/segments/here/"),
    ("get", "/api/v1/nodes/../../admin/"),
    ("get", "/api/v1/%00/"),
]


@pytest.mark.parametrize("persona", ["anon", "t1_member", "platform_admin"])
def test_unknown_api_url_is_json_404(world, subtests, persona):
    """Unknown /api/ URLs answer the JSON not_found error, not Django's HTML page."""
    client = world.client(persona)
    for method, path in UNKNOWN_URLS:
        with case(subtests, method=method, path=path):
            assert_error(send(client, method, path), 404, "not_found")


#
# Reads: content negotiation, pagination, ordering, filters
#


def test_accept_xml_is_406(world):
    """Only JSON is served; a client that accepts only XML gets a JSON 406."""
    client = world.client("t1_member")

    response = client.get("/api/v1/teams/", HTTP_ACCEPT="application/xml")

    assert_error(response, 406, "not_acceptable")
    assert client.get("/api/v1/teams/").status_code == 200


@pytest.mark.parametrize("page_size", ["1000000", str(10**30)])
def test_page_size_is_capped_at_200(world, page_size):
    """A huge page_size returns at most 200 rows, with a link to the rest."""
    small_fleet(32)  # 256 GPUs

    response = world.client("platform_admin").get("/api/v1/gpus/", {"page_size": page_size})

    assert response.status_code == 200, response.content[:600]
    body = response.json()
    assert body["count"] == 256
    assert len(body["results"]) == 200
    assert body["next"] is not None


@pytest.mark.parametrize("page_size", ["-5", "0", "abc", "\x00"])
def test_nonsense_page_size_falls_back_to_the_default(world, page_size):
    """A page_size that is not a positive number is ignored (the default page), never a 500."""
    small_fleet(8)  # 64 GPUs

    response = world.client("platform_admin").get("/api/v1/gpus/", {"page_size": page_size})

    assert response.status_code == 200, response.content[:600]
    assert len(response.json()["results"]) == 50


@pytest.mark.parametrize("page", ["abc", "999999", "0", "-1", "1 OR 1=1", "\x00", "9" * 5000])
def test_garbage_page_is_json_404(world, page):
    """A page that is not a page is a JSON 404, and page 1 still works."""
    client = world.client("t1_owner")

    response = client.get("/api/v1/teams/", {"page": page})

    assert_error(response, 404, "not_found")
    assert client.get("/api/v1/teams/", {"page": 1}).status_code == 200


def _ids(response) -> list:
    assert response.status_code == 200, response.content[:600]
    return [row["id"] for row in response.json()["results"]]


@pytest.mark.parametrize("ordering", ["-digest", "digest", "prefix", "user__password", "no_such_field", "-",
                                      "created_at;DROP TABLE tenants_apitoken", "\x00"])
def test_ordering_outside_the_allowlist_is_ignored_on_tokens(world, ordering):
    """Ordering by a secret or unknown field is ignored: the default order, and no secret in the answer."""
    client = world.client("t1_owner")
    default = _ids(client.get("/api/v1/api-tokens/"))

    response = client.get("/api/v1/api-tokens/", {"ordering": ordering})

    assert _ids(response) == default
    assert len(default) >= 3
    for row in response.json()["results"]:
        assert not {"digest", "prefix", "token"} & set(row)


@pytest.mark.parametrize("ordering", ["bmc_password", "-bmc_password", "bmc_username", "gpus__uuid"])
def test_ordering_by_node_secrets_is_ignored(world, ordering):
    """Nodes cannot be sorted by their BMC credentials (no ordering oracle); the default order stands."""
    small_fleet(8)
    client = world.client("platform_admin")
    default = _ids(client.get("/api/v1/nodes/"))

    response = client.get("/api/v1/nodes/", {"ordering": ordering})

    assert _ids(response) == default
    assert "bmc_password" not in response.content.decode()


FILTERS = [
    ("t1_owner", "/api/v1/teams/", "slug"),
    ("t1_owner", "/api/v1/memberships/", "role"),
    ("t1_owner", "/api/v1/team-memberships/", "team"),
    ("t1_owner", "/api/v1/team-memberships/", "role"),
    ("t1_owner", "/api/v1/invitations/", "team"),
    ("t1_owner", "/api/v1/api-tokens/", "scope"),
    ("t1_owner", "/api/v1/api-tokens/", "team"),
    ("t1_owner", "/api/v1/quotas/", "tenant"),
    ("t1_owner", "/api/v1/quotas/", "resource"),
    ("t1_owner", "/api/v1/high-priority-applications/", "state"),
    ("t1_owner", "/api/v1/high-priority-applications/", "team"),
    ("t1_member", "/api/v1/notifications/", "kind"),
    ("t1_member", "/api/v1/notifications/", "team"),
    ("t1_member", "/api/v1/notifications/", "unread"),
    ("t1_owner", "/api/v1/audit-events/", "action"),
    ("t1_owner", "/api/v1/audit-events/", "actor_id"),
    ("t1_member", "/api/v1/offerings/", "gpu_model"),
    ("t1_member", "/api/v1/offerings/", "kind"),
    ("t1_member", "/api/v1/offerings/", "is_active"),
    ("t1_member", "/api/v1/regions/", "slug"),
    ("t1_member", "/api/v1/gpu-models/", "vendor"),
    ("platform_admin", "/api/v1/tenants/", "slug"),
    ("platform_admin", "/api/v1/fabrics/", "region"),
    ("platform_admin", "/api/v1/nodes/", "hostname"),
    ("platform_admin", "/api/v1/nodes/", "region"),
    ("platform_admin", "/api/v1/nodes/", "fabric"),
    ("platform_admin", "/api/v1/gpus/", "node"),
    ("platform_admin", "/api/v1/gpus/", "model"),
    ("platform_admin", "/api/v1/sla/", "tenant"),
    ("platform_admin", "/api/v1/sla/", "slug"),
    ("platform_admin", "/api/v1/incidents/", "kind"),
    ("platform_admin", "/api/v1/incidents/", "node"),
    ("platform_admin", "/api/v1/incidents/", "assignee"),
    ("platform_admin", "/api/v1/incidents/", "open"),
    ("t1_viewer", "/api/v1/incidents/", "kind"),
]


HOSTILE_VALUES = {"5000-chars": "x" * 5000, "nul": "\x00", "sql": "' OR 1=1 --"}


@pytest.mark.parametrize(("persona", "path", "param"), FILTERS, ids=[f"{p}?{f}" for _, p, f in FILTERS])
def test_hostile_filter_value_is_400_or_empty(world, subtests, persona, path, param):
    """
    A 5,000-character, NUL or SQL filter value is a JSON 400 or a page no larger than the
    unfiltered one (a boolean filter ignores a value it cannot read), never a 500.
    """
    small_fleet(4)
    client = world.client(persona)
    unfiltered = client.get(path).json()["count"]
    for name, value in HOSTILE_VALUES.items():
        with case(subtests, value=name):
            response = client.get(path, {param: value})

            if response.status_code == 200:
                assert response.json()["count"] in (0, unfiltered), response.content[:600]
            else:
                assert_error(response, 400)
            assert client.get(path).status_code == 200


def test_a_thousand_filter_params_is_not_a_500(world):
    """1,000 repeated filter parameters are answered (400 or 200), never a 500."""
    client = world.client("t1_member")
    query = "&".join(f"gpu_model={unique('m')}" for _ in range(1000))

    response = client.get(f"/api/v1/offerings/?{query}")

    if response.status_code != 200:
        assert_error(response, 400)


#
# SLA months (GET /api/v1/sla/?month=YYYY-MM)
#

BAD_MONTHS = ["2026-13", "2026-00", "2026-1", "26-11", "2026/11", "november", "1999-12", "9999-01", "2026-11-01",
              "\x00", "x" * 5000, "' OR 1=1 --", "\uff12\uff10\uff12\uff16-\uff11\uff11"]


@pytest.mark.parametrize("persona", ["t1_viewer", "platform_admin"])
def test_bad_sla_month_is_a_400_naming_the_month(world, subtests, persona):
    """A month that is not YYYY-MM, not a month, before 2000 or not begun yet is a JSON 400 on the list and detail."""
    client = world.client(persona)
    for path in ("/api/v1/sla/", f"/api/v1/sla/{world.t1.tenant.pk}/"):
        for month in BAD_MONTHS:
            with case(subtests, path=path, month=month[:20]):
                before = row_counts()

                response = client.get(path, {"month": month})

                assert_error(response, 400, attr="month")
                assert row_counts() == before
        assert client.get(path, {"month": "2026-01"}).status_code == 200


#
# Telemetry reads (GET /api/v1/gpus/{id}/telemetry/, /api/v1/reservations/{id}/telemetry/)
#

BAD_TELEMETRY_QUERIES = [
    ("period", "5m"), ("period", "RAW"), ("period", "\x00"), ("period", "x" * 5000),
    ("since", "yesterday"), ("since", "2026-13-01T00:00:00Z"), ("since", "\x00"), ("since", "x" * 5000),
    ("since", "' OR 1=1 --"), ("since", "9999-01-01T00:00:00Z"),
]


@pytest.mark.parametrize("persona", ["t1_viewer", "platform_admin"])
def test_bad_telemetry_period_or_since_is_a_400_naming_it(world, subtests, persona):
    """
    An unknown period, or a since that is not an ISO 8601 time or lies in the future, is a JSON 400
    (an empty one is as good as none given: the default applies, as for every query parameter).
    """
    small_fleet(4)
    from cloud.models import GPU
    from provisioning.models import Reservation

    paths = [f"/api/v1/reservations/{world.t1.objects[Reservation].pk}/telemetry/"]
    if persona == "platform_admin":
        paths.append(f"/api/v1/gpus/{GPU.objects.order_by('pk').first().pk}/telemetry/")
    client = world.client(persona)
    for path in paths:
        for param, value in BAD_TELEMETRY_QUERIES:
            with case(subtests, path=path, param=param, value=value[:20]):
                before = row_counts()

                response = client.get(path, {param: value})

                assert_error(response, 400, attr=param)
                assert row_counts() == before
        assert client.get(path, {"period": "1h", "since": "2026-01-01T00:00:00Z"}).status_code == 200
