"""
Tracing's hooks for the lower layers: a span around each driver call (``traced_driver``, used by
the driver registries), attributes on the current span, and the ids log lines carry.

Off until ``config.tracing`` turns tracing on for the process (``enable``): until then every hook
returns at once, ``traced_driver`` hands the driver back as it is, and OpenTelemetry is not even
imported here.
"""

from __future__ import annotations

from typing import Any

_tracer = None  # an OpenTelemetry Tracer while tracing is on
_trace = None  # the opentelemetry.trace module, imported when tracing is turned on


def enable(tracer) -> None:
    global _tracer, _trace
    from opentelemetry import trace

    _trace, _tracer = trace, tracer


def disable() -> None:
    global _tracer
    _tracer = None


def enabled() -> bool:
    return _tracer is not None


def annotate(**attributes: Any) -> None:
    """Set ``meridian.<name>`` attributes on the current span (nothing while tracing is off)."""
    if _tracer is None:
        return
    span = _trace.get_current_span()
    if span.is_recording():
        for name, value in attributes.items():
            if value is not None:
                span.set_attribute(f"meridian.{name}", value)


def current_ids() -> tuple[str | None, str | None]:
    """The current span's trace and span ids, in hex (None, None outside a span or while off)."""
    if _tracer is None:
        return None, None
    context = _trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None, None
    return format(context.trace_id, "032x"), format(context.span_id, "016x")


def traced_driver(kind: str, driver):
    """``driver`` whose public methods each run in a span ``driver.<kind>.<method>`` while tracing is on."""
    if _tracer is None:
        return driver
    return _TracedDriver(kind, driver)


class _TracedDriver:
    """
    Stands in for a driver: a method call gets a span with the driver's kind and class, and the
    node (a ``Target``'s id and host name) or volume (``ref=``) it was for. Everything else, and
    ``isinstance``, reaches the driver itself.
    """

    __slots__ = ("_kind", "_driver")

    def __init__(self, kind: str, driver):
        object.__setattr__(self, "_kind", kind)
        object.__setattr__(self, "_driver", driver)

    @property
    def __class__(self):
        return type(self._driver)

    def __getattr__(self, name: str):
        value = getattr(self._driver, name)
        if name.startswith("_") or not callable(value):
            return value
        kind, driver = self._kind, self._driver

        def call(*args, **kwargs):
            tracer = _tracer
            if tracer is None:
                return value(*args, **kwargs)
            attributes = {"meridian.driver.kind": kind, "meridian.driver": type(driver).__name__}
            target = args[0] if args else None
            if hasattr(target, "node_id") and hasattr(target, "hostname"):
                attributes["meridian.node.id"] = str(target.node_id)
                attributes["meridian.node.hostname"] = target.hostname
            if isinstance(kwargs.get("ref"), str):
                attributes["meridian.storage.ref"] = kwargs["ref"]
            with tracer.start_as_current_span(f"driver.{kind}.{name}", attributes=attributes):
                return value(*args, **kwargs)

        return call

    def __setattr__(self, name: str, value) -> None:
        setattr(self._driver, name, value)

    def __repr__(self):
        return repr(self._driver)
