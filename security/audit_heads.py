"""
The audit chain's signed heads, published outside the database they protect.

A checkpoint row proves the chain's head only while it is there: whoever can delete the newest
audit events can delete the checkpoints vouching for them too. So every checkpoint the sealer
signs is also appended, once its seal has committed, as one JSON line to a file in
MERIDIAN_AUDIT_HEAD_DIR (opened O_APPEND, one file per host, so a shared folder never sees two
writers in one file) and logged to ``meridian.audit.head`` (MERIDIAN_AUDIT_HEAD_SYSLOG sends that
logger to syslog). The operator keeps that folder where the database's writer cannot rewrite it
(an append-only file system attribute, a WORM bucket it is copied to, a remote log sink).

Reading back, every ``*.jsonl`` file directly in the folder counts (copies collected from other
hosts may be dropped there). A line that agrees with the chain needs nothing more: the chain's
own keyed links vouch for it. A line that disagrees is checked against its signature: signed by
Meridian's receipt key, it proves the chain once held that head (truncation or replacement); not,
it was forged into the file.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from django.conf import settings

logger = logging.getLogger("meridian.audit.head")


@dataclass(frozen=True)
class PublishedHead:
    """One published checkpoint: after ``seq`` events the chain hash was ``head_hash``."""

    seq: int
    head_hash: str
    signed_at: datetime
    kid: str
    signature: str
    source: str  # "file:line", for the report

    def as_dict(self) -> dict:
        return {"seq": self.seq, "head_hash": self.head_hash, "signed_at": self.signed_at.isoformat(),
                "source": self.source}


def head_dir() -> Path:
    return Path(settings.MERIDIAN_AUDIT_HEAD_DIR)


def head_file() -> Path:
    """This host's file: hosts sharing a folder each append to their own."""
    return head_dir() / f"audit-heads-{socket.gethostname()}.jsonl"


def publish_head(*, seq: int, head_hash: str, signed_at: datetime, kid: str, signature: str) -> None:
    """Append a signed checkpoint to this host's head file (one write of one line) and log it."""
    line = json.dumps({"seq": seq, "head_hash": head_hash, "signed_at": signed_at.isoformat(), "kid": kid,
                       "signature": signature}, sort_keys=True, separators=(",", ":"))
    path = head_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
    try:
        os.write(fd, (line + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    logger.info(line)


def published_heads(paths: Iterable[Path] = (), *, folder: Path | None = None) -> tuple[list[PublishedHead], list[str]]:
    """
    Every head published in ``folder`` (default: the configured one) and in ``paths`` (files or
    folders), and what could not be read as one: an unreadable file or a line that is not a head.
    """
    files: list[Path] = []
    for place in [folder or head_dir(), *map(Path, paths)]:
        files.extend(sorted(place.glob("*.jsonl")) if place.is_dir() else [place] if place.exists() else [])
    heads, unreadable = [], []
    for path in files:
        try:
            heads.extend(_read(path, unreadable))
        except OSError as exc:
            unreadable.append(f"{path}: {exc.strerror or exc}")
    return heads, unreadable


def _read(path: Path, unreadable: list[str]) -> Iterator[PublishedHead]:
    with path.open(encoding="utf-8", errors="replace") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
                yield PublishedHead(seq=int(data["seq"]), head_hash=str(data["head_hash"]),
                                    signed_at=datetime.fromisoformat(data["signed_at"]), kid=str(data["kid"]),
                                    signature=str(data["signature"]), source=f"{path}:{number}")
            except (ValueError, KeyError, TypeError):
                unreadable.append(f"{path}:{number} is not a published head")
