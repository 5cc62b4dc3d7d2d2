"""
A strict reading of Kubernetes manifests into the pinned ``kubernetes`` client's models.

The client's own deserializer is lenient (it drops unknown fields and takes any type); a field
misspelt in a manifest would pass it and be ignored by a real API server too, or refused there.
Here each mapping is walked against its model class's ``attribute_map`` (the JSON names) and
``openapi_types``: an unknown field, or a value of the wrong type, is an error naming its path;
the model constructors, run with client-side validation on, refuse a missing required field.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client
from kubernetes.client import Configuration

_VALIDATING = Configuration()
_VALIDATING.client_side_validation = True

# Fields the API types as resource.Quantity, which the client types as plain strings: the API server
# takes a number there too (``cpu: 2``), so a number is no mistake in these.
QUANTITIES = {
    ("V1ResourceRequirements", "limits"), ("V1ResourceRequirements", "requests"),
    ("V1VolumeResourceRequirements", "limits"), ("V1VolumeResourceRequirements", "requests"),
    ("V1EmptyDirVolumeSource", "size_limit"), ("V2MetricTarget", "average_value"), ("V2MetricTarget", "value"),
}

_LIST = re.compile(r"^list\[(.+)\]$")
_DICT = re.compile(r"^dict[\[(]str, (.+)[\])]$")


@dataclass
class Reading:
    """The models built from one document, and what was wrong with it (empty: it is sound)."""

    model: Any = None
    errors: list[str] = field(default_factory=list)


def model_class(api_version: str, kind: str) -> type:
    """``apps/v1`` + ``Deployment`` -> ``V1Deployment``; ``autoscaling/v2`` + ``HorizontalPodAutoscaler`` -> V2..."""
    version = api_version.rsplit("/", 1)[-1]
    name = version[:1].upper() + version[1:] + kind
    cls = getattr(client, name, None)
    if cls is None or not hasattr(cls, "openapi_types"):
        raise LookupError(f"no model {name} for apiVersion {api_version!r}, kind {kind!r} in the kubernetes client")
    return cls


def read(document: dict) -> Reading:
    """The document as its model, strictly; ``errors`` says every problem found."""
    reading = Reading()
    if not isinstance(document, dict):
        reading.errors.append("$: a manifest must be a mapping")
        return reading
    try:
        cls = model_class(str(document.get("apiVersion", "")), str(document.get("kind", "")))
    except LookupError as error:
        reading.errors.append(f"$: {error}")
        return reading
    reading.model = _build(document, cls.__name__, "$", reading.errors)
    return reading


def _build(value: Any, type_name: str, path: str, errors: list[str], quantity: bool = False) -> Any:
    if value is None:
        return None  # a required field's constructor refuses None itself
    if match := _LIST.match(type_name):
        if not isinstance(value, list):
            errors.append(f"{path}: expected a list ({type_name}), got {type(value).__name__}")
            return None
        return [_build(item, match.group(1), f"{path}[{i}]", errors) for i, item in enumerate(value)]
    if match := _DICT.match(type_name):
        if not isinstance(value, dict):
            errors.append(f"{path}: expected a mapping ({type_name}), got {type(value).__name__}")
            return None
        return {key: _build(item, match.group(1), f"{path}.{key}", errors, quantity)
                for key, item in value.items()}
    if quantity and isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    scalar = _scalar(value, type_name, path)
    if isinstance(scalar, _Wrong):
        errors.append(scalar.message)
        return None
    if scalar is not _NOT_SCALAR:
        return scalar
    cls = getattr(client, type_name, None)
    if cls is None or not hasattr(cls, "openapi_types"):
        errors.append(f"{path}: the client knows no type {type_name!r}")
        return None
    if not isinstance(value, dict):
        errors.append(f"{path}: expected a mapping ({type_name}), got {type(value).__name__}")
        return None
    by_json_name = {json_name: attr for attr, json_name in cls.attribute_map.items()}
    kwargs = {}
    for key, item in value.items():
        attr = by_json_name.get(key)
        if attr is None:
            errors.append(f"{path}.{key}: unknown field of {type_name}")
            continue
        kwargs[attr] = _build(item, cls.openapi_types[attr], f"{path}.{key}", errors,
                              (type_name, attr) in QUANTITIES)
    try:
        return cls(**kwargs, local_vars_configuration=_VALIDATING)
    except (ValueError, TypeError) as error:
        errors.append(f"{path}: {type_name}: {error}")
        return None


_NOT_SCALAR = object()


@dataclass(frozen=True)
class _Wrong:
    message: str


def _scalar(value: Any, type_name: str, path: str) -> Any:
    """The value if ``type_name`` is a scalar it fits; _Wrong if it does not fit; _NOT_SCALAR if not a scalar."""
    expected = {"str": (str,), "int": (int,), "bool": (bool,), "float": (int, float), "datetime": (str,),
                "date": (str,)}.get(type_name)
    if type_name == "object":
        return value  # IntOrString and free-form fields
    if expected is None:
        return _NOT_SCALAR
    if isinstance(value, bool) and type_name != "bool":
        return _Wrong(f"{path}: expected {type_name}, got bool")
    if not isinstance(value, expected):
        return _Wrong(f"{path}: expected {type_name}, got {type(value).__name__} ({value!r})")
    return value
