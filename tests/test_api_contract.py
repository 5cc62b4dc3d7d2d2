"""
The API keeps the promises its README and schema make: integers and floats are JSON numbers
everywhere, every list answers in pages (and the schema says so), the anonymous invitation accept
is documented as open, /api/v1/ lists the resources, and a VPC's members come in address order.
"""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import get_resolver
from drf_spectacular.generators import SchemaGenerator
from rest_framework import serializers

from provisioning.models import VPC, Instance, PortMembership, Reservation
from tests.provisioning.factories import make_reservation
from tests.world import fleet_node, small_fleet, vm_offering, world_vpc
from web.api.base import JSONNumberMixin, StrictSerializerMixin

V1 = "/api/v1"


@pytest.fixture
def fleet(world):
    return small_fleet(4)


@pytest.fixture(scope="module")
def schema() -> dict:
    return SchemaGenerator().get_schema(request=None, public=True)


def reservation_body(**extra) -> dict:
    return {"name": "train", "offering": vm_offering().slug, "gpus": 1, "regions": ["us-east-1"],
            "duration_hours": 2, **extra}


def refused(response) -> set[tuple[str, str]]:
    assert response.status_code == 400, response.content
    return {(e["attr"], e["code"]) for e in response.json()["errors"]}


#
# Numbers are JSON numbers
#


@pytest.mark.parametrize(("persona", "url", "body", "attr"), [
    ("t1_member", "reservations/", lambda w: reservation_body(duration_hours="12"), "duration_hours"),
    ("t1_member", "reservations/", lambda w: reservation_body(gpus="1"), "gpus"),
    ("t1_member", "reservations/", lambda w: {
        **{k: v for k, v in reservation_body().items() if k != "offering"},
        "spec": {"kind": "vm", "min_fp16_tflops": 60, "min_memory_gib": "70"}}, "spec.min_memory_gib"),
    ("t1_member", "reservations/", lambda w: reservation_body(duration_hours=True), "duration_hours"),
    ("t1_member", "api-tokens/", lambda w: {"name": "ci", "expires_in_days": "30"}, "expires_in_days"),
    ("t1_member", "vpcs/", lambda w: {"name": "v", "region": "us-east-1", "service_level": "1"}, "service_level"),
    ("t1_member", "vpcs/", lambda w: {"name": "v", "region": "us-east-1", "rate_gbps": "100"}, "rate_gbps"),
    ("t1_member", "vpcs/", lambda w: {"name": "v", "region": "us-east-1", "mtu": "4096"}, "mtu"),
    ("platform_admin", "quotas/", lambda w: {"tenant": str(w.t1.tenant.pk), "resource": "vpcs", "limit": "4"},
     "limit"),
    ("platform_admin", "gpu-models/", lambda w: {"slug": "l40s-48gb", "name": "NVIDIA L40S", "memory_gib": "48",
                                                  "memory_bandwidth_tbs": "0.86", "fp16_tflops": "362.0",
                                                  "tdp_watts": 350}, "memory_gib"),
    ("platform_admin", "offerings/", lambda w: {"slug": "h100-vm-1x", "name": "H100 VM 1x", "kind": "vm",
                                                 "gpu_model": "h100-80gb-sxm", "gpus_per_unit": "1",
                                                 "price_per_gpu_hour": "2.4900"}, "gpus_per_unit"),
])
def test_a_number_sent_as_a_string_is_refused_like_gpus_is(world, fleet, persona, url, body, attr):
    """"12" is not 12: a clear 400 on the field, whatever the field (decimal amounts excepted, see below)."""
    response = world.client(persona).post(f"{V1}/{url}", body(world), format="json")
    assert (attr, "invalid") in refused(response)
    [error] = [e for e in response.json()["errors"] if e["attr"] == attr]
    assert "JSON number" in error["detail"]


def test_extend_takes_its_hours_as_a_json_number(world, fleet):
    client = world.client("t1_member")
    placed = client.post(f"{V1}/reservations/", reservation_body(), format="json").json()
    assert refused(client.post(f"{V1}/reservations/{placed['id']}/extend/", {"hours": "4"}, format="json")) == {
        ("hours", "invalid")}
    assert client.post(f"{V1}/reservations/{placed['id']}/extend/", {"hours": 1}, format="json").status_code == 200


def test_a_decimal_amount_may_be_sent_as_the_string_the_api_answers_with(world):
    """Exact decimals (prices, bandwidth, TFLOPS) are answered as strings: sent back as read, or as numbers, work."""
    response = world.client("platform_admin").post(f"{V1}/gpu-models/", {
        "slug": "l40s-48gb", "name": "NVIDIA L40S", "memory_gib": 48, "memory_bandwidth_tbs": "0.86",
        "fp16_tflops": 362.0, "tdp_watts": 350}, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["memory_bandwidth_tbs"] == "0.86" and response.json()["fp16_tflops"] == "362.0"


def _numbers(serializer, path=""):
    for name, field in serializer.fields.items():
        if field.read_only:
            continue
        if isinstance(field, serializers.ListSerializer):
            field = field.child
        if isinstance(field, serializers.BaseSerializer):
            yield from _numbers(field, f"{path}{name}.")
        elif _is_number(field):
            yield f"{path}{name}", field


def _is_number(field) -> bool:
    """An integer or float field, or a choice among numbers (the IB MTU)."""
    if isinstance(field, serializers.IntegerField | serializers.FloatField):
        return True
    return isinstance(field, serializers.ChoiceField) and bool(field.choices) and all(
        isinstance(key, int) for key in field.choices)


def test_every_number_a_body_can_carry_must_be_a_json_number():
    """A walker over every serializer that reads a body: a new integer or float field cannot coerce "12"."""
    get_resolver().url_patterns  # noqa: B018 -- imports every view, and so every serializer
    found, todo = [], [StrictSerializerMixin]
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if issubclass(cls, serializers.BaseSerializer) and (
                not issubclass(cls, serializers.ModelSerializer) or hasattr(cls, "Meta")):
            found.append(cls)
    coerced = [f"{cls.__module__}.{cls.__name__}.{where}" for cls in found
               for where, field in _numbers(cls()) if not isinstance(field, JSONNumberMixin)]
    assert len(found) > 20 and not coerced, coerced


#
# Lists are paginated, and the schema says so
#


PAGE_KEYS = {"count", "next", "previous", "results"}


def test_receipts_and_vpc_members_answer_in_pages_like_every_list(world, fleet):
    client = world.client("t1_viewer")
    receipts = client.get(f"{V1}/reservations/{world.t1.objects[Reservation].pk}/receipts/")
    members = client.get(f"{V1}/vpcs/{world.t1.objects[VPC].pk}/members/", {"page_size": 1})
    for response in (receipts, members):
        assert response.status_code == 200, response.content
        assert set(response.json()) == PAGE_KEYS, response.json()


@pytest.mark.parametrize("path", ["/api/v1/reservations/{id}/receipts/", "/api/v1/vpcs/{id}/members/"])
def test_the_schema_documents_those_lists_as_paginated(schema, path):
    answer = schema["paths"][path]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
    component = answer["$ref"].rsplit("/", 1)[1]
    assert component.startswith("Paginated"), answer
    assert set(schema["components"]["schemas"][component]["properties"]) >= PAGE_KEYS


def test_vpc_members_come_in_address_order_numerically(world, fleet):
    """.2 before .9 before .10: the members (and each one's addresses) in numeric address order."""
    vpc = world_vpc(world.t1.tenant)
    node = fleet_node()
    ports = iter(node.ib_ports.order_by("index").values_list("guid", flat=True))
    for name, addresses in [("x-10", ["10.20.0.11", "10.20.0.10"]), ("x-9", ["10.20.0.9", "10.20.0.2"])]:
        instance = Instance.objects.create(
            tenant=world.t1.tenant, reservation=make_reservation(world, state="active"), node=node, index=0,
            kind="vm", state="active", name=name)
        for address in addresses:
            PortMembership.objects.create(vpc=vpc, instance=instance, guid=next(ports), address=address)
    page = world.client("t1_viewer").get(f"{V1}/vpcs/{vpc.pk}/members/").json()
    assert [(m["name"], m["addresses"]) for m in page["results"]] == [
        ("x-9", ["10.20.0.2", "10.20.0.9"]), ("x-10", ["10.20.0.10", "10.20.0.11"])]


#
# Who may call what, as the schema says
#


def test_the_schema_says_anyone_may_accept_an_invitation(schema):
    """POST /invitations/accept/ makes an account for a person who has none: open, as the view is."""
    security = schema["paths"]["/api/v1/invitations/accept/"]["post"]["security"]
    assert {} in security
    assert {} not in schema["paths"]["/api/v1/reservations/"]["post"]["security"]


#
# The API root
#


@pytest.mark.parametrize("persona", ["anon", "t1_member"])
def test_the_api_root_lists_every_resource(world, persona):
    """/api/v1/ (the link the start banner prints) answers with every resource and where the docs are."""
    response = world.client(persona).get(f"{V1}/")
    assert response.status_code == 200, response.content
    listed = response.json()
    for name in ("reservations", "vpcs", "offerings", "api-tokens", "me", "invitations/accept", "schema", "docs"):
        assert name in listed, (name, listed)
    assert listed["reservations"].endswith("/api/v1/reservations/")
    assert listed["docs"].endswith("/api/docs/")
    assert Client().get(listed["reservations"].replace("http://testserver", "")).status_code == 401
