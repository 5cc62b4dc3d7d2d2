"""
A volume's files, for the checkpoint moves (``storage.checkpoints``): list what is under a prefix,
read and write one chunk of a file, remove a file. A move copies a checkpoint chunk by chunk, each
chunk written at its own place, so a move cut short starts again from the last chunk recorded and a
chunk written twice is the same chunk.

``MountedFiles`` serves a file system mounted where the moving worker runs (a Storage Scale file
system, ``<mount>/<ref>/<key>``); the object driver serves buckets (each chunk an object) and the
simulated driver keeps sizes only.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath

from storage.drivers.base import StorageDriverError


@dataclass(frozen=True)
class FileInfo:
    size: int  # bytes
    modified: datetime


def checked_key(key: str) -> str:
    """A relative path inside a volume (no ``..``, not absolute), or a StorageDriverError."""
    path = PurePosixPath(key)
    if not key or path.is_absolute() or ".." in path.parts or "\x00" in key:
        raise StorageDriverError(f"'{key}' is not a path inside a volume.", transient=False)
    return str(path)


class MountedFiles:
    """Files of volumes under ``root`` (each volume's directory named by its reference)."""

    def __init__(self, *, root: str):
        self.root = Path(root)

    def files(self, *, ref: str, prefix: str) -> dict[str, FileInfo]:
        base = self._path(ref, prefix) if prefix else self.root / ref
        found = {}
        if not base.exists():
            return found
        for directory, dirs, names in os.walk(base):
            dirs[:] = [d for d in dirs if d != ".snapshots"]  # a file system's snapshots are not its files
            for name in names:
                path = Path(directory) / name
                stat = path.stat()
                found[str(path.relative_to(self.root / ref))] = FileInfo(
                    size=stat.st_size, modified=datetime.fromtimestamp(stat.st_mtime, tz=UTC))
        return found

    def read_chunk(self, *, ref: str, key: str, index: int, chunk: int) -> bytes:
        try:
            with open(self._path(ref, key), "rb") as handle:
                handle.seek(index * chunk)
                return handle.read(chunk)
        except FileNotFoundError:
            raise StorageDriverError(f"{ref} has no file {key} to read.", transient=False) from None
        except OSError as exc:
            raise StorageDriverError(f"Reading {key} of {ref} failed: {exc}", transient=True) from exc

    def write_chunk(self, *, ref: str, key: str, index: int, chunk: int, data: bytes) -> None:
        path = self._path(ref, key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                os.pwrite(fd, data, index * chunk)
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            raise StorageDriverError(f"Writing {key} of {ref} failed: {exc}", transient=True) from exc

    def truncate(self, *, ref: str, key: str, size: int) -> None:
        """Cut a file written again to its size (a file that was longer before keeps no tail)."""
        try:
            os.truncate(self._path(ref, key), size)
        except OSError as exc:
            raise StorageDriverError(f"Sizing {key} of {ref} failed: {exc}", transient=True) from exc

    def copy_tree(self, *, from_ref: str, subdir: str, to_ref: str) -> None:
        """Copy a volume's directory (a snapshot's) into another volume, over what is there already."""
        try:
            shutil.copytree(self._path(from_ref, subdir), self.root / checked_key(to_ref), dirs_exist_ok=True)
        except FileNotFoundError:
            raise StorageDriverError(f"{from_ref} has no {subdir} to copy.", transient=False) from None
        except OSError as exc:
            raise StorageDriverError(f"Copying {subdir} of {from_ref} failed: {exc}", transient=True) from exc

    def remove(self, *, ref: str, key: str) -> None:
        path = self._path(ref, key)
        path.unlink(missing_ok=True)
        for parent in path.parents:  # leave no empty directories behind, up to the volume's own
            if parent == self.root / ref or not parent.is_relative_to(self.root / ref):
                break
            try:
                parent.rmdir()
            except OSError:
                break

    def _path(self, ref: str, key: str) -> Path:
        return self.root / checked_key(ref) / checked_key(key)
