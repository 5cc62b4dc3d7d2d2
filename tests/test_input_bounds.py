"""
Input bounds: a list in a body is refused on its length before any of its items is looked up,
and an error answer stays small whatever the body carried (each list, unknown field and echoed
value of a 1 MB body could otherwise come back as an error of its own).
"""

from __future__ import annotations

import pytest
from django.urls import get_resolver
from rest_framework import serializers
from rest_framework.relations import ManyRelatedField

from provisioning.api.serializers import MAX_REGIONS
from tests.world import small_fleet, vm_offering
from web.api.base import BoundedDictField, BoundedListField, StrictSerializerMixin
from web.api.errors import MAX_ATTR_CHARS, MAX_DETAIL_CHARS, MAX_ERRORS

RESERVATIONS = "/api/v1/reservations/"
# An error answer's size whatever the body: MAX_ERRORS errors of bounded detail and attr, and one more
# saying how many were left out.
ANSWER_BOUND = (MAX_ERRORS + 1) * (MAX_DETAIL_CHARS + MAX_ATTR_CHARS + 200)


def reservation(**extra) -> dict:
    return {"name": "train", "offering": vm_offering().slug, "gpus": 1, "regions": ["us-east-1"],
            "duration_hours": 2, **extra}


def errors(response) -> list[dict]:
    return response.json()["errors"]


@pytest.fixture
def fleet(world):
    return small_fleet(4)


def test_a_long_regions_list_is_refused_on_its_length_before_any_region_is_looked_up(
        world, fleet, django_assert_max_num_queries):
    """60,000 unknown regions (700 KB) are one 400 ``max_length`` as cheap as a list one too long."""
    client = world.client("t1_member")
    client.post(RESERVATIONS, reservation(), format="json")  # the token, offering and region are remembered
    names = [f"nowhere-{i}" for i in range(60_000)]
    with django_assert_max_num_queries(MAX_REGIONS) as taken:
        response = client.post(RESERVATIONS, reservation(regions=names), format="json")
    assert response.status_code == 400, response.content[:500]
    assert [(e["attr"], e["code"]) for e in errors(response)] == [("regions", "max_length")]
    assert len(response.content) < 500
    with django_assert_max_num_queries(len(taken)):  # no more than a list one entry too long
        client.post(RESERVATIONS, reservation(regions=names[:MAX_REGIONS + 1]), format="json")


def test_many_mistakes_in_one_body_answer_the_first_ones_and_how_many_more(world):
    """20,000 unknown fields: MAX_ERRORS errors, then one ``too_many_errors`` with the count left out."""
    body = {"name": "ci", **{f"colour_{i}": "red" for i in range(20_000)}}
    response = world.client("t1_member").post("/api/v1/api-tokens/", body, format="json")
    assert response.status_code == 400
    found = errors(response)
    assert len(found) == MAX_ERRORS + 1
    assert {e["code"] for e in found[:-1]} == {"unknown_field"}
    assert found[-1]["code"] == "too_many_errors" and found[-1]["attr"] is None
    assert f"{20_000 - MAX_ERRORS} more" in found[-1]["detail"]
    assert len(response.content) < ANSWER_BOUND


@pytest.mark.parametrize("body", [
    pytest.param({"name": "ci", "scope": "x" * 900_000}, id="echoed-choice"),
    pytest.param({"name": "ci", "y" * 900_000: 1}, id="long-field-name"),
])
def test_an_error_never_echoes_a_long_value_or_field_name_whole(world, body):
    """A refused value or field name that the message repeats is cut short: the answer stays small."""
    response = world.client("t1_member").post("/api/v1/api-tokens/", body, format="json")
    assert response.status_code == 400
    [error] = errors(response)
    assert len(error["detail"]) <= MAX_DETAIL_CHARS and len(error["attr"]) <= MAX_ATTR_CHARS
    assert error["detail"].endswith("…") or error["attr"].endswith("…")
    assert len(response.content) < ANSWER_BOUND


def test_long_port_guid_and_measurement_lists_are_refused_on_their_length(world):
    """Node enrolment's port GUIDs and reference measurements: length first, one error, not one per item."""
    admin = world.client("platform_admin")
    enrol = admin.post("/api/v1/nodes/", {"ib_port_guids": [{"not": "a guid"}] * 20_000}, format="json")
    assert enrol.status_code == 400
    assert ("ib_port_guids", "max_length") in {(e["attr"], e["code"]) for e in errors(enrol)}
    assert len(enrol.content) < ANSWER_BOUND
    measured = admin.post("/api/v1/reference-measurements/", {
        "gpu_model": "h100-80gb-sxm", "vbios_version": "96.00.aa.00.01", "driver_version": "575.1",
        "measurements": {str(i): ["not", "a", "digest"] for i in range(20_000)}}, format="json")
    assert measured.status_code == 400
    assert [(e["attr"], e["code"]) for e in errors(measured)] == [("measurements", "max_length")]


def _input_fields(serializer, path=""):
    """Every writable field of ``serializer``, nested ones included, with its dotted path."""
    for name, field in serializer.fields.items():
        if field.read_only:
            continue
        where = f"{path}{name}"
        yield where, field
        if isinstance(field, serializers.ListSerializer):
            yield from _input_fields(field.child, f"{where}.")
        elif isinstance(field, serializers.BaseSerializer):
            yield from _input_fields(field, f"{where}.")


def _body_serializers() -> list[type[serializers.BaseSerializer]]:
    """Every serializer that reads a request body: the API's are strict (unknown fields are a 400)."""
    get_resolver().url_patterns  # noqa: B018 -- imports every view, and so every serializer
    found, todo = [], [StrictSerializerMixin]
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if issubclass(cls, serializers.BaseSerializer):
            found.append(cls)
    return found


def test_every_list_a_body_can_carry_is_bounded_before_its_items():
    """A walker: a new list or mapping input must be a bounded field, so its length is checked first."""
    assert len(_body_serializers()) > 20
    unbounded = [f"{cls.__module__}.{cls.__name__}.{where}"
                 for cls in _body_serializers() if (serializer := _made(cls)) is not None
                 for where, field in _input_fields(serializer) if not _bounded(field)]
    assert not unbounded, unbounded


def _made(cls):
    if issubclass(cls, serializers.ModelSerializer) and not hasattr(cls, "Meta"):
        return None  # a base class
    try:
        return cls()
    except TypeError:  # a serializer that needs arguments is an output one
        return None


def _bounded(field) -> bool:
    if isinstance(field, serializers.ListField):
        return isinstance(field, BoundedListField)
    if isinstance(field, serializers.DictField):
        return isinstance(field, BoundedDictField)
    if isinstance(field, serializers.ListSerializer):
        return field.max_length is not None
    return not isinstance(field, ManyRelatedField)  # no bound of its own: a BoundedListField of related fields
