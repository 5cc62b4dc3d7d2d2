"""
A reservation's instances as a SkyPilot SSH Node Pool (``~/.sky/ssh_node_pools.yaml``), so that
``sky ssh up`` makes Meridian capacity SkyPilot infrastructure. The file maps a pool name to its
``hosts`` (each an address, or a mapping with ``ip``, ``user``, ``identity_file``), with ``user`` and
``identity_file`` for the pool; other pools in the file are kept.
"""

from __future__ import annotations

from pathlib import Path

import yaml

DEFAULT_PATH = Path.home() / ".sky" / "ssh_node_pools.yaml"


def pool_entry(instances: list[dict], *, identity_file: str) -> dict:
    """The pool of ``instances`` (the API's instances of one reservation): their addresses and login user."""
    hosts = [i.get("public_ip") or i.get("address") or i.get("private_ip") for i in instances]
    users = {i.get("ssh_user") for i in instances}
    if not instances or not all(hosts):
        raise ValueError("The reservation has no instance with an address yet: wait until it is active.")
    entry = {"hosts": hosts, "user": users.pop() if len(users) == 1 else "ubuntu", "identity_file": identity_file}
    return entry


def pool_write(name: str, entry: dict, path: Path = DEFAULT_PATH) -> Path:
    """Add or replace the pool ``name`` in the file, keeping the others."""
    pools = yaml.safe_load(path.read_text()) if path.exists() else {}
    pools = pools or {}
    pools[name] = entry
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(pools, sort_keys=False))
    return path
