"""
Where the client's URL, token and tenant come from: arguments, else the environment (MERIDIAN_URL,
MERIDIAN_TOKEN, MERIDIAN_TENANT), else a profile of the profile file (``meridian login`` writes it,
mode 0600): ``$MERIDIAN_CONFIG`` or ``~/.config/meridian/profiles.json``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Settings:
    url: str
    token: str | None
    tenant: str | None


def profile_path() -> Path:
    return Path(os.environ.get("MERIDIAN_CONFIG") or Path.home() / ".config" / "meridian" / "profiles.json")


def profiles() -> dict:
    path = profile_path()
    return json.loads(path.read_text()) if path.exists() else {}


def profile_save(name: str, *, url: str, token: str, tenant: str | None = None) -> Path:
    """Store a profile (the file is made readable by its owner only: it holds a token)."""
    path = profile_path()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    known = profiles()
    known[name] = {"url": url, "token": token, "tenant": tenant}
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as out:
        json.dump(known, out, indent=2)
    os.chmod(path, 0o600)
    return path


def resolve(url: str | None = None, token: str | None = None, tenant: str | None = None,
            profile: str | None = None) -> Settings:
    chosen = profiles().get(profile or os.environ.get("MERIDIAN_PROFILE") or "default", {})
    url = url or os.environ.get("MERIDIAN_URL") or chosen.get("url")
    if not url:
        raise ValueError("No Meridian URL: pass url=, set MERIDIAN_URL, or run `meridian login`.")
    return Settings(url=url.rstrip("/"), token=token or os.environ.get("MERIDIAN_TOKEN") or chosen.get("token"),
                    tenant=tenant or os.environ.get("MERIDIAN_TENANT") or chosen.get("tenant"))
