"""
An instance's SSH host keys, so its tenant can check the fingerprint SSH shows on the first login
(instead of trusting it blindly). Two ways in, as on other clouds: the instance reports them
once booted (cloud-init's ``phone_home`` to its report URL, ``provisioning.cloud_init``), or
cloud-init prints them on the console between ``-----BEGIN SSH HOST KEY KEYS-----`` and its END
line, which Meridian reads when it hands the instance over. The first report wins: a later one
(a tenant's process knowing the URL) cannot swap the keys the tenant was shown.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re

from django.utils import timezone

from provisioning.models import Instance

KEY_LINE = re.compile(r"^(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp(?:256|384|521))\s+([A-Za-z0-9+/]+={0,2})(?:\s|$)")
CONSOLE_BLOCK = re.compile(r"-----BEGIN SSH HOST KEY KEYS-----(.*?)-----END SSH HOST KEY KEYS-----", re.DOTALL)
MAX_KEYS = 8


def parse(lines) -> list[dict]:
    """[{"type", "key", "fingerprint"}] of the OpenSSH public keys among ``lines``, once each, in order."""
    keys, seen = [], set()
    for line in lines:
        match = KEY_LINE.match(str(line).strip())
        if not match or match.group(2) in seen:
            continue
        try:
            blob = base64.b64decode(match.group(2), validate=True)
        except binascii.Error:
            continue
        seen.add(match.group(2))
        digest = base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")
        keys.append({"type": match.group(1), "key": f"{match.group(1)} {match.group(2)}",
                     "fingerprint": f"SHA256:{digest}"})
    return keys[:MAX_KEYS]


def from_console(text: str) -> list[dict]:
    """The host keys cloud-init printed on the console (the last block: a reboot prints them again)."""
    blocks = CONSOLE_BLOCK.findall(text or "")
    return parse(blocks[-1].splitlines()) if blocks else []


def record(instance: Instance, keys: list[dict]) -> bool:
    """Keep ``keys`` as the instance's host keys unless it has some already; True when kept."""
    if not keys:
        return False
    kept = Instance.objects.filter(pk=instance.pk, reported_at__isnull=True).update(
        host_keys=keys, reported_at=timezone.now())
    if kept:
        instance.host_keys = keys
    return bool(kept)


__all__ = ["from_console", "parse", "record"]
