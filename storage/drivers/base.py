"""The storage driver interface (``storage.drivers``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from provisioning.drivers.base import DriverError


class StorageDriverError(DriverError):
    """A backend call failed; ``transient``: worth retrying (timeout, busy, 5xx), otherwise for good."""


@dataclass(frozen=True)
class Export:
    """How instances reach a volume: a block device path, or a file system's export and who may mount it."""

    target: str  # "/dev/disk/by-id/virtio-<serial>" for a block volume, "fs01:/gpfs/vol-..." for a file system
    clients: tuple[str, ...] = ()  # the addresses (CIDRs) allowed to mount it; empty for a block device


class StorageDriver(Protocol):
    def create(self, *, ref: str, kind: str, size_gib: int, source: tuple[str, str] | None = None) -> None:
        """
        Make the volume (a volume, fileset or bucket) of ``size_gib``, as a copy of snapshot
        ``source`` (volume reference, snapshot reference) when given; one that exists already is done.
        """

    def snapshot(self, *, ref: str, snapshot: str) -> None:
        """Take snapshot ``snapshot`` of the volume now; one taken already is done."""

    def snapshot_delete(self, *, ref: str, snapshot: str) -> None:
        """Remove the snapshot; one that is gone is done."""

    def resize(self, *, ref: str, size_gib: int) -> None:
        """Grow it to ``size_gib``; one that size or larger is done. Shrinking is refused before a driver is asked."""

    def delete(self, *, ref: str) -> None:
        """Remove it and what it holds; one that is gone is done."""

    def export(self, *, ref: str, clients: tuple[str, ...]) -> Export:
        """Let ``clients`` (CIDRs) reach it, and only them; returns where it is reached."""

    def refs(self) -> set[str]:
        """Every volume the backend holds (to find what a lost step left behind)."""

    def exports(self, *, refs: set[str]) -> dict[str, tuple[str, ...]]:
        """The clients each of ``refs`` (file systems, buckets) lets in, as the backend holds it; absent: none held."""

    # Files, for checkpoint moves (storage.data): a driver that cannot reach a volume's files
    # (a block volume's pool) does not have them.
    def files(self, *, ref: str, prefix: str) -> dict:
        """Every file under ``prefix``: its key -> FileInfo (size, modified)."""

    def read_chunk(self, *, ref: str, key: str, index: int, chunk: int) -> bytes:
        """Bytes ``index * chunk`` to ``(index + 1) * chunk`` of the file (fewer at its end)."""

    def write_chunk(self, *, ref: str, key: str, index: int, chunk: int, data: bytes) -> None:
        """Write ``data`` as chunk ``index`` of the file (made when missing); written twice, the same."""

    def truncate(self, *, ref: str, key: str, size: int) -> None:
        """Cut the file to ``size`` bytes."""

    def remove(self, *, ref: str, key: str) -> None:
        """Remove the file; one that is gone is done."""
