"""
The host's InfiniBand ports as the agent reports them: port GUID and link up or down.

- ``SysfsPorts``: the kernel's view, ``/sys/class/infiniband/<hca>/ports/<n>/``: ``state`` ("4:
  ACTIVE" is up; DOWN, INIT and ARMED are not yet carrying traffic), ``link_layer`` (only
  InfiniBand ports, not RoCE), and ``gids/0`` whose lower 64 bits are the port GUID.
- ``SimulatedPorts``: GUIDs in memory, with ``port_down``/``port_up`` for tests and the demo.
"""

from __future__ import annotations

from pathlib import Path

SYSFS = Path("/sys/class/infiniband")


class SysfsPorts:
    def __init__(self, root: Path | str = SYSFS):
        self.root = Path(root)

    def states(self) -> list[dict]:
        """[{"guid", "link"}] for every InfiniBand port of the host's HCAs; [] when there are none."""
        found = []
        for port in sorted(self.root.glob("*/ports/*")):
            try:
                if (port / "link_layer").read_text().strip().lower() != "infiniband":
                    continue
                gid = (port / "gids" / "0").read_text().strip()
                state = (port / "state").read_text().strip().upper()
            except OSError:
                continue  # a port that went away while read: the next heartbeat will tell
            guid = gid.replace(":", "")[-16:].lower()
            if len(guid) == 16 and guid != "0" * 16:
                found.append({"guid": guid, "link": "up" if state.endswith("ACTIVE") else "down"})
        return found


class SimulatedPorts:
    def __init__(self, guids: list[str]):
        self.links = {guid.lower(): "up" for guid in guids}

    def states(self) -> list[dict]:
        return [{"guid": guid, "link": link} for guid, link in self.links.items()]

    def port_down(self, guid: str) -> None:
        self.links[guid.lower()] = "down"

    def port_up(self, guid: str) -> None:
        self.links[guid.lower()] = "up"
