"""
The embedded default's cache: Django's file cache, with its read-modify-write operations atomic.

Django's FileBasedCache writes whole entries by rename, so a reader never sees half a file, but
its ``incr`` is a get and a set and its ``add`` a has_key and a set: eight threads counting one
token's requests lost most of their increments, and the rate limit let four times its rate
through. Here every operation that changes an entry runs under an exclusive lock (flock, so it
holds across threads and the web, worker and scheduler processes alike) on one of a few lock
files chosen by the entry's name, and ``incr`` keeps the entry's expiry instead of writing the
default one. Reads take no lock.
"""

from __future__ import annotations

import os
import pickle
import tempfile
import time
import zlib
from contextlib import contextmanager

from django.core.cache.backends.base import DEFAULT_TIMEOUT
from django.core.cache.backends.filebased import FileBasedCache
from django.core.files import locks
from django.core.files.move import file_move_safe

LOCK_STRIPES = 64
_MISSING = object()


class AtomicFileCache(FileBasedCache):
    """FileBasedCache whose add, set, incr/decr and touch are atomic across threads and processes."""

    def add(self, key, value, timeout=DEFAULT_TIMEOUT, version=None):
        fname = self._key_to_file(key, version)
        with self._locked(fname):
            if self._read(fname) is not _MISSING:
                return False
            self._cull()
            self._write(fname, self.get_backend_timeout(timeout), value)
            return True

    def set(self, key, value, timeout=DEFAULT_TIMEOUT, version=None):
        fname = self._key_to_file(key, version)
        with self._locked(fname):
            self._cull()
            self._write(fname, self.get_backend_timeout(timeout), value)

    def incr(self, key, delta=1, version=None):
        fname = self._key_to_file(key, version)
        with self._locked(fname):
            entry = self._read(fname)
            if entry is _MISSING:
                raise ValueError(f"Key '{key}' not found")
            expiry, value = entry
            value += delta
            self._write(fname, expiry, value)
            return value

    def touch(self, key, timeout=DEFAULT_TIMEOUT, version=None):
        fname = self._key_to_file(key, version)
        with self._locked(fname):
            entry = self._read(fname)
            if entry is _MISSING:
                return False
            self._write(fname, self.get_backend_timeout(timeout), entry[1])
            return True

    def _is_expired(self, f):
        """As Django's, but an expired entry is removed under its lock, and only if it is still expired:
        a lock-free reader must not delete an entry that ``add`` has just written in its place."""
        try:
            expiry = pickle.load(f)  # noqa: S301 -- Meridian's own entries, in its 0700 folder (as Django's)
        except EOFError:
            expiry = 0
        if expiry is not None and expiry < time.time():
            f.close()
            with self._locked(f.name):
                self._read(f.name)  # deletes it if it is expired still
            return True
        return False

    @contextmanager
    def _locked(self, fname: str):
        self._createdir()
        folder = os.path.join(self._dir, "locks")
        os.makedirs(folder, mode=0o700, exist_ok=True)
        stripe = int(os.path.basename(fname)[:8], 16) % LOCK_STRIPES
        with open(os.path.join(folder, f"{stripe}.lock"), "ab") as lock:
            locks.lock(lock, locks.LOCK_EX)
            try:
                yield
            finally:
                locks.unlock(lock)

    def _read(self, fname: str):
        """(expiry, value) of a live entry, or _MISSING; an expired one is deleted. Under the entry's lock."""
        try:
            with open(fname, "rb") as f:
                try:
                    expiry = pickle.load(f)  # noqa: S301 -- as above
                except EOFError:
                    expiry = 0
                if expiry is None or expiry >= time.time():
                    return expiry, pickle.loads(zlib.decompress(f.read()))  # noqa: S301 -- as above
        except FileNotFoundError:
            return _MISSING
        self._delete(fname)
        return _MISSING

    def _write(self, fname: str, expiry: float | None, value) -> None:
        """Replace the entry whole (readers see the old file or the new one). Under the entry's lock."""
        fd, tmp_path = tempfile.mkstemp(dir=self._dir)
        renamed = False
        try:
            with open(fd, "wb") as f:
                f.write(pickle.dumps(expiry, self.pickle_protocol))
                f.write(zlib.compress(pickle.dumps(value, self.pickle_protocol)))
            file_move_safe(tmp_path, fname, allow_overwrite=True)
            renamed = True
        finally:
            if not renamed:
                os.remove(tmp_path)
