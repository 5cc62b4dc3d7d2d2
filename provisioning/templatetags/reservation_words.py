"""
Numbers and names of the reservation pages as a person reads them: "4 hours", not ``4:00:00``;
"1/7 GPU", not ``0.14285714285714285``; "Check and attest the hardware", not ``verify``.
``{% load reservation_words %}``.
"""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from fractions import Fraction

from django import template
from django.contrib.humanize.templatetags.humanize import intcomma

from provisioning.lifecycle.steps import step_title
from provisioning.scheduling.priority import FACTOR_LABELS

register = template.Library()


def _plural(count: int, word: str) -> str:
    return f"{intcomma(count)} {word}" if count == 1 else f"{intcomma(count)} {word}s"


@register.filter
def amount(value) -> str:
    """A count that may be fractional, to one decimal at most: 190.9, 512, 1,024."""
    if value is None or value == "":
        return ""
    rounded = round(float(value), 1)
    text = f"{rounded:,.1f}".removesuffix(".0")
    return "0" if text == "-0" else text


@register.filter
def gpus(value) -> str:
    """An amount of GPUs: "16 GPUs", "1 GPU", "1/7 GPU" (a slot), "2.5 GPUs"."""
    number = float(value)
    if number.is_integer():
        return _plural(int(number), "GPU")
    fraction = Fraction(number).limit_denominator(16)
    if fraction.numerator < fraction.denominator and abs(float(fraction) - number) < 1e-9:
        return f"{fraction.numerator}/{fraction.denominator} GPU"
    return f"{amount(number)} GPUs"


@register.filter
def units_of(count, offering) -> str:
    """``count`` of what ``offering`` is sold by: "2 nodes", "1 slot", "3 units of 8 GPUs", "1 GPU"."""
    count = int(count)
    if offering.kind == "bare_metal":
        return _plural(count, "node")
    if offering.slots_per_gpu > 1:
        return _plural(count, "slot")
    if offering.gpus_per_unit > 1:
        return f"{_plural(count, 'unit')} of {offering.gpus_per_unit} GPUs"
    return _plural(count, "GPU")


def _seconds(value) -> float:
    if isinstance(value, timedelta):
        return value.total_seconds()
    return float(value)


@register.filter
def duration_words(value) -> str:
    """A reservation's length: "4 hours", "1 hour 30 minutes", "2 days 6 hours", "45 minutes"."""
    minutes = round(_seconds(value) / 60)
    days, rest = divmod(minutes, 24 * 60)
    hours, minutes = divmod(rest, 60)
    parts = [_plural(days, "day") if days else "", _plural(hours, "hour") if hours else "",
             _plural(minutes, "minute") if minutes else ""]
    return " ".join(part for part in parts if part) or "less than a minute"


@register.filter
def hours_words(hours) -> str:
    """A number of hours (the form's and the estimate's unit) as ``duration_words``."""
    return duration_words(timedelta(hours=float(Decimal(str(hours)))))


@register.filter
def elapsed(value) -> str:
    """A step's or an operation's time: "8 s", "2 min 5 s", "1 h 4 min"."""
    seconds = max(0, round(_seconds(value)))
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {seconds} s" if seconds else f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min" if minutes else f"{hours} h"


@register.filter
def slice_gib(allocation) -> str:
    """The GPU memory a slot's allocation holds: "11.4 GiB"."""
    return f"{amount((allocation.mem_hi - allocation.mem_lo) / 1024)} GiB"


@register.filter
def work_name(kind: str) -> str:
    """An operation's kind as the work it does: "Provisioning", "Release"."""
    return {"provision": "Provisioning", "release": "Release", "validate": "Validation"}.get(kind, kind.capitalize())


@register.filter
def factor_label(name: str) -> str:
    return FACTOR_LABELS.get(name) or name.replace("_", " ").capitalize()


@register.filter
def step_label(name: str) -> str:
    return step_title(name)
