"""InfiniBand port GUIDs in one spelling: 16 lower-case hex digits, no 0x."""

from __future__ import annotations

import re

_GUID = re.compile(r"^(0x)?([0-9a-f]{1,16})$")


def normal_guid(guid: str) -> str:
    """A port GUID as 16 lower-case hex digits, no ``0x``; ValueError when it is not one."""
    match = _GUID.match(str(guid).strip().lower())
    if not match:
        raise ValueError(f"'{guid}' is not a 64-bit port GUID (16 hex digits, optionally 0x-prefixed).")
    return match.group(2).rjust(16, "0")
