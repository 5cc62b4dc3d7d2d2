"""The agent's loop: heartbeat, pull commands, run them, report. Django-free (urllib only)."""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request

from .signing import signed_headers

log = logging.getLogger("meridian.agent")
API = "/api/agent/v1"


class ControlPlaneError(Exception):
    """The control plane refused a request (the body says why) or could not be reached."""


class ControlPlane:
    """The node API, signed with this node's key."""

    def __init__(self, base_url: str, key_id: str, secret: str, timeout: float = 10.0):
        self.base_url, self.key_id, self.secret, self.timeout = base_url.rstrip("/"), key_id, secret, timeout

    def call(self, method: str, path: str, payload: dict | None = None) -> dict:
        body = b"" if payload is None else json.dumps(payload).encode()
        headers = {"Content-Type": "application/json",
                   **signed_headers(self.key_id, self.secret, method, f"{API}{path}", body)}
        if not self.base_url.startswith(("http://", "https://")):
            raise ControlPlaneError(f"The control plane URL must be http(s): {self.base_url}")
        request = urllib.request.Request(f"{self.base_url}{API}{path}", data=body or None,  # noqa: S310 -- checked
                                         method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:  # noqa: S310 -- our own URL
                return json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as exc:
            raise ControlPlaneError(f"{method} {path}: {exc.code} {exc.read()[:300]!r}") from exc
        except OSError as exc:
            raise ControlPlaneError(f"{method} {path}: {exc}") from exc


class Agent:
    """One node's agent: ``run_once`` is one turn of the loop; ``run`` turns every ``interval``."""

    def __init__(self, control_plane, nvml, *, version: str = "1", attester=None, hostname: str = ""):
        self.control_plane, self.nvml, self.version = control_plane, nvml, version
        self.attester, self.hostname = attester, hostname

    def run_once(self) -> int:
        """Heartbeat, then run every waiting command; returns how many ran."""
        self.control_plane.call("POST", "/heartbeat/", {"agent_version": self.version,
                                                       "gpus": self.nvml.inventory()})
        commands = self.control_plane.call("GET", "/commands/").get("commands", [])
        for command in commands:
            self.control_plane.call("POST", f"/commands/{command['id']}/result/", self.execute(command))
        return len(commands)

    def execute(self, command: dict) -> dict:
        try:
            if command["kind"] == "scrub":
                devices = command["payload"]["devices"]
                clean = all(self.nvml.scrub(d["index"], d["mem_lo"], d["mem_hi"]) for d in devices)
                return {"ok": clean, "detail": "" if clean else "memory still in use after the scrub"}
            if command["kind"] == "inventory":
                return {"ok": True, "gpus": self.nvml.inventory()}
            if command["kind"] == "attest":
                if self.attester is None:
                    return {"ok": False, "detail": "this agent has no attestation backend"}
                wanted = set(command["payload"]["gpus"])
                gpus = [gpu for gpu in self.nvml.inventory() if gpu["index"] in wanted]
                return {"ok": True, "evidence": self.attester.evidence(self.hostname, command["payload"]["nonce"],
                                                                       gpus)}
            return {"ok": False, "detail": f"unknown command {command['kind']!r}"}
        except Exception as exc:  # one bad command must not stop the agent: report it
            log.exception("command %s failed", command.get("id"))
            return {"ok": False, "detail": f"{type(exc).__name__}: {exc}"}

    def run(self, interval: float = 10.0, stop=lambda: False) -> None:
        while not stop():
            try:
                self.run_once()
            except ControlPlaneError as exc:
                log.warning("control plane: %s", exc)
            time.sleep(interval)
