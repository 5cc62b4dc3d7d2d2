"""
The Compose Specification's JSON schema (compose-spec.json, Apache-2.0), as the npm package dclint
(MIT) ships it: the specification publishes no package of its own, and PyPI's only copy (in
docker-compose 1.29.2) is of 2021. The pinned tarball is fetched once with ``npm pack``, checked against its SHA-256,
and the schema unpacked under var/compose-spec/ (the repository keeps no copy of it).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

PACKAGE = "dclint@3.1.0"
TARBALL_SHA256 = "73fc6079a0408c80c7ccea9e9e5c21c40551afaf15e8c1ee25a5ad6af1ec0414"
MEMBER = "package/schemas/compose.schema.json"
HOME = Path(__file__).resolve().parents[2] / "var" / "compose-spec"
SCHEMA = HOME / "compose-spec.json"


def fetch() -> dict:
    """The schema, downloading the pinned package the first time (safe across test workers)."""
    if not (HOME / "complete").exists():
        npm = shutil.which("npm")
        if npm is None:
            raise RuntimeError("npm is not installed")
        with tempfile.TemporaryDirectory() as scratch:
            subprocess.run([npm, "pack", "--silent", "--pack-destination", scratch, PACKAGE], check=True,
                           timeout=300, cwd=scratch, stdout=subprocess.DEVNULL)
            tarball = next(Path(scratch).glob("*.tgz"))
            digest = hashlib.sha256(tarball.read_bytes()).hexdigest()
            if digest != TARBALL_SHA256:
                raise RuntimeError(f"{tarball.name} has SHA-256 {digest}, not the pinned {TARBALL_SHA256}")
            unpacked = Path(scratch) / "compose-spec"
            unpacked.mkdir()
            with tarfile.open(tarball) as archive:
                source = archive.extractfile(MEMBER)
                if source is None:
                    raise RuntimeError(f"{PACKAGE} has no {MEMBER}")
                (unpacked / SCHEMA.name).write_bytes(source.read())
            (unpacked / "complete").write_text(f"{PACKAGE} {MEMBER}\n")
            HOME.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(OSError):  # another worker got there first
                os.rename(unpacked, HOME)
    return json.loads(SCHEMA.read_text())
