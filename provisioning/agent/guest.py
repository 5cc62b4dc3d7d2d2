"""
The in-guest agent: inside a VM (or on a tenant's bare-metal server), where the GPUs are visible
to the guest's NVML and to no Meridian host agent. It reads the URL its instance's config drive
wrote (``/etc/meridian/guest-agent.json``: the per-instance secret is in the URL) and posts one
sample per GPU every interval -- utilization, memory, temperature, power, ECC and the XIDs raised --
as the host agent's heartbeat carries them. Nothing else: it holds no other credential and can
report only this instance's GPUs (the control plane refuses others).
"""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request
from pathlib import Path

from provisioning.agent.agent import Agent

log = logging.getLogger("meridian.guest-agent")


class GuestReporter:
    def __init__(self, nvml, config: Path | str, *, timeout: float = 10.0):
        self.url = json.loads(Path(config).read_text())["telemetry_url"]
        if not self.url.startswith(("https://", "http://")):
            raise ValueError(f"{config}: telemetry_url must be an http(s) URL")
        self.sampler = Agent(None, nvml)  # the host agent's sampling, its XID bookkeeping included
        self.timeout = timeout

    def turn(self) -> dict:
        """Sample every GPU and post; the answer says how many were stored. XIDs not delivered are sent next time."""
        samples = self.sampler.samples(self.sampler.nvml.inventory())
        request = urllib.request.Request(  # noqa: S310 -- an http(s) URL, checked when the config was read
            self.url, data=json.dumps({"samples": samples}).encode(), method="POST",
            headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as answer:  # noqa: S310 -- the configured URL
                return json.loads(answer.read() or b"{}")
        except (urllib.error.URLError, OSError, ValueError) as error:
            for sample in samples:  # kept for the next turn, as the host agent keeps them
                if sample.get("xids"):
                    self.sampler.unsent_xids.setdefault(sample["uuid"], []).extend(sample["xids"])
            raise ConnectionError(f"posting GPU telemetry to {self.url.split('/instance-data/')[0]} failed: "
                                  f"{error}") from error

    def run(self, interval: float = 10.0, stop=lambda: False) -> None:
        while not stop():
            try:
                self.turn()
            except ConnectionError as error:
                log.warning("%s", error)
            time.sleep(interval)
