"""
Why a request waits, in words a tenant can act on: what it needs, and what each region and GPU
model it accepts could offer for its window ("needs 64 GPUs ...; H100 in us-east-1: 40 GPUs free
until 14:00").
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from uuid import UUID

from provisioning.scheduling.plan_types import BARE_METAL, Request
from provisioning.scheduling.planner.fit import Shortfall
from provisioning.scheduling.planner.state import FOREVER, TICK

NO_CAPACITY = "no spot work of lower priority to evict makes room"


def plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


class Wording:
    def __init__(self, now: datetime, model_names: Mapping[UUID, str], origin: int = 0):
        self.now = now  # what tick 0 is
        self.origin = origin  # the tick that is now
        self.today = (now + origin * TICK).date()
        self.model_names = model_names

    def model(self, model_id: UUID) -> str:
        return self.model_names.get(model_id) or "its GPU model"  # never an id: a person reads this

    def clock(self, ticks: int) -> str:
        moment = self.now + ticks * TICK
        return moment.strftime("%H:%M" if moment.date() == self.today else "%Y-%m-%d %H:%M")

    def where(self, region: str, model_id: UUID) -> str:
        return f"{self.model(model_id)} in {region}"

    def needs(self, request: Request, s: int, e: int) -> str:
        """What the request asks for, and when."""
        when = f"from {'now' if s == self.origin else self.clock(s)} to {self.clock(e)}"
        if request.kind == BARE_METAL:
            what = f"{plural(request.units, 'whole node')} ({plural(request.units * request.gpus_per_unit, 'GPU')})"
        elif request.slots_per_gpu > 1:
            what = f"{plural(request.units, 'slot')} of 1/{request.slots_per_gpu} GPU"
            if request.share_class:
                what += f" time-sliced for {request.share_class} work"
        elif request.units == 1:
            what = plural(request.gpus_per_unit, "GPU") + (" on one node" if request.gpus_per_unit > 1 else "")
        else:
            what = f"{request.units} x {plural(request.gpus_per_unit, 'GPU')} (each on one node)"
        return f"needs {what} {when}"

    def shortfall(self, request: Request, where: str, short: Shortfall, release: int) -> str:
        """What one region and model can offer; ``release`` is when GPUs busy now start to free up."""
        until = f" until {self.clock(release)}" if release < FOREVER else ""
        if request.kind == BARE_METAL:
            offer = f"{plural(short.free, 'whole node')} free{until}"
            if short.fits < short.free:
                offer += f", at most {short.fits} on one fabric"
            if request.units > 1 and short.free:
                offer += f", at most {short.largest_leaf} under one leaf"
        elif request.slots_per_gpu > 1:
            offer = f"{plural(short.free, 'slot')} free{until}"
        else:
            offer = f"{plural(short.free, 'GPU')} free{until}"
            if request.gpus_per_unit > 1 and short.free >= request.gpus_per_unit:
                offer += (f", but no node has {request.gpus_per_unit} of them" if not short.fits else
                          f", room for {plural(short.fits, 'unit')} of {request.gpus_per_unit} on single nodes")
        return f"{where}: {offer}"

    def headroom(self, where: str, s: int, before: float, after: float, kept: float, spot: bool = False,
                 until: datetime | None = None) -> str:
        # Counts may hold shares of GPUs cut into slots (planner.load): 5.625 GPUs reads "5.62".
        free, taking, kept_ = (f"{n:.2f}".rstrip("0").rstrip(".") for n in (before, before - after, kept))
        waits = ("reserved requests may not use the headroom" if until is None else
                 f"reserved requests may not use the headroom before they have waited for it: this one may from "
                 f"{self.clock((until - self.now) // TICK)}")
        return (f"{where}: {free} GPU{'' if free == '1' else 's'} free{' or held by spot work' if spot else ''} "
                f"{'now' if s == self.origin else 'at ' + self.clock(s)}; taking {taking} would leave fewer than "
                f"the {kept_} kept for on-demand work ({waits})")

    def reason(self, request: Request, s: int, e: int, situations: list[str]) -> str:
        return "; ".join([self.needs(request, s, e), *situations])
