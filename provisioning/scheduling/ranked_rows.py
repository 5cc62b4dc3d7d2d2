"""
The whole rows of the ranked queue, read as planning reaches them.

A cycle ranks the best MERIDIAN_SCHEDULER_QUEUE_DEPTH (1,000) but a budgeted cycle plans a hundred
or two of them: reading every row up front was a fifth of a cycle that ranked afresh. ``RankedRows``
holds the ranked ids in order and reads their rows in chunks, each chunk from the first id asked
for that is not read yet; rows kept from earlier cycles are there from the start. A row read a
moment after the ranking is as good as one read with it: whatever left the queue meanwhile is
skipped or refused at apply, as a lost race is.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

CHUNK = 128


class RankedRows(Mapping):
    def __init__(self, order: list, kept: dict, load: Callable[[list], dict[Any, Any]]):
        self.order = order
        self.position = {pk: i for i, pk in enumerate(order)}
        self.loaded = {pk: row for pk, row in kept.items() if pk in self.position}
        self.load = load
        self.dropped: set = set()

    def __getitem__(self, pk):
        if pk in self.dropped or pk not in self.position:
            raise KeyError(pk)
        if pk not in self.loaded:
            at = self.position[pk]
            chunk = [p for p in self.order[at:at + CHUNK] if p not in self.loaded and p not in self.dropped]
            self.loaded.update(self.load(chunk))
            for p in chunk:  # gone from the database meanwhile: not asked for again
                if p not in self.loaded:
                    self.dropped.add(p)
            if pk in self.dropped:
                raise KeyError(pk)
        return self.loaded[pk]

    def __contains__(self, pk) -> bool:
        return pk in self.position and pk not in self.dropped

    def __iter__(self) -> Iterator:
        return (pk for pk in self.order if pk not in self.dropped)

    def __len__(self) -> int:
        return len(self.order) - len(self.dropped)

    def pop(self, pk, default=None):
        """Forget one (handed to services, which change it); it is read afresh if ranked again."""
        if pk not in self:
            return default
        self.dropped.add(pk)
        return self.loaded.pop(pk, default)
