"""The agent's loop: heartbeat, pull commands, run them, report. Django-free (urllib only)."""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import os
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request

from provisioning.agent import acceptance, topology
from provisioning.agent.liveness import Pinger
from provisioning.agent.nvml import NVMLReadError
from provisioning.agent.signing import signed_headers
from provisioning.agent.time_slices import TimeSlicer
from security.isolation import KILL_PROCESS, STOP_CONTAINER, GPUPolicy, Process, evaluate

log = logging.getLogger("meridian.agent")
API = "/api/agent/v1"


class ControlPlaneError(Exception):
    """The control plane refused a request (the body says why; ``status`` its HTTP status) or could not be reached."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


class ControlPlane:
    """The node API, signed with this node's key."""

    def __init__(self, base_url: str, key_id: str, secret: str, timeout: float = 10.0):
        self.base_url, self.key_id, self.secret, self.timeout = base_url.rstrip("/"), key_id, secret, timeout

    def call(self, method: str, path: str, payload: dict | None = None, timeout: float | None = None) -> dict:
        body = b"" if payload is None else json.dumps(payload).encode()
        headers = {
            "Content-Type": "application/json",
            **signed_headers(self.key_id, self.secret, method, f"{API}{path}", body),
        }
        if not self.base_url.startswith(("http://", "https://")):
            raise ControlPlaneError(f"The control plane URL must be http(s): {self.base_url}")
        request = urllib.request.Request(  # noqa: S310 -- the scheme is checked above
            f"{self.base_url}{API}{path}", data=body or None, method=method, headers=headers
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout or self.timeout) as response:  # noqa: S310 -- our own URL
                answer = json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as exc:
            raise ControlPlaneError(f"{method} {path}: {exc.code} {exc.read()[:300]!r}", exc.code) from exc
        except (OSError, http.client.HTTPException) as exc:  # refused, reset, cut short mid-answer
            raise ControlPlaneError(f"{method} {path}: {type(exc).__name__}: {exc}") from exc
        except ValueError as exc:  # not JSON: a proxy's error page, a truncated body
            raise ControlPlaneError(f"{method} {path}: the answer is not JSON: {exc}") from exc
        if not isinstance(answer, dict):
            raise ControlPlaneError(f"{method} {path}: the answer is not a JSON object")
        return answer


MAX_XIDS = 64  # per GPU and heartbeat, as the control plane accepts them


class Agent:
    """
    One node's agent: ``run_once`` is one turn of the loop; ``run`` turns every ``interval``, or
    every ``interval_s`` the control plane answered last. ``ports`` reads the host's InfiniBand
    ports (agent.ports); ``silent`` stops the heartbeat (tests and the demo: a hung agent).
    """

    def __init__(
        self,
        control_plane,
        nvml,
        *,
        version: str = "1",
        attester=None,
        hostname: str = "",
        process_owner=None,
        kill=None,
        scrub_command: list[str] | None = None,
        baseline_mib: int = 1024,
        mig_command: list[str] | None = None,
        ports=None,
        time_slice_command: list[str] | None = None,
        slot_scrub_command: list[str] | None = None,
        stress_command: list[str] | None = None,
        fabric_test_command: list[str] | None = None,
    ):
        self.control_plane, self.nvml, self.version = control_plane, nvml, version
        self.ports = ports
        self.silent = False
        self.interval: float | None = None  # from the control plane's last answer
        # Liveness pings between turns, on their own thread (agent.liveness), as often as the answer says.
        self.pinger = Pinger(control_plane, paused=lambda: self.silent) if control_plane is not None else None
        # The isolation policy the control plane gave last, and its version: sent with every
        # heartbeat, so the policy comes back only when it changed. The watchdog enforces the one held.
        self.policy: list[dict] = []
        self.policy_version: str | None = None
        self.unsent_xids: dict[str, list[int]] = {}  # by GPU UUID: XIDs of a heartbeat that did not get through
        self.attester, self.hostname = attester, hostname
        # A shared GPU's slot is cleared by this command ({index}, {mem_lo}, {mem_hi} in MiB), never by a reset.
        self.slot_scrub_command = slot_scrub_command
        # The acceptance checks' stress steps on a real host (provisioning.agent.acceptance says what they print).
        self.stress_command, self.fabric_test_command = stress_command, fabric_test_command
        # Who runs a process (its cgroup: a VM's domain, a pod) and how to stop one: the host's, by default.
        self.process_owner = process_owner or cgroup_owner
        self.kill = kill or kill_process
        # Real GPUs are cleared by a reset the host is configured with ({index} is the GPU), e.g.
        # ["nvidia-smi", "--gpu-reset", "-i", "{index}"]; simulated ones clear their memory.
        self.scrub_command, self.baseline_mib = scrub_command, baseline_mib
        # How a real GPU is cut into a MIG layout ({index}, {layout}), and what each GPU was cut into.
        self.mig_command = mig_command
        self.mig_layouts: dict[int, str] = {}
        self.slicer = TimeSlicer(nvml, time_slice_command)
        self._places: dict[int, dict] = {}  # each GPU's place in the node (agent.topology), read once

    def run_once(self) -> int:
        """
        Heartbeat, the isolation watchdog on the policy held (brought back when it changed), then
        every waiting command (pulled only when the heartbeat's answer says some wait, or does not say).
        """
        if self.silent:
            return 0
        body = self.heartbeat()
        try:
            answer = self.control_plane.call("POST", "/heartbeat/", body)
        except ControlPlaneError:
            # NVML reports an XID once: keep those of this heartbeat for the next one.
            for sample in body["samples"]:
                if sample["xids"]:
                    self.unsent_xids[sample["uuid"]] = sample["xids"]
            raise
        if isinstance(answer.get("interval_s"), int | float) and answer["interval_s"] > 0:
            self.interval = min(max(float(answer["interval_s"]), 1.0), 3600.0)
        if self.pinger is not None:
            self.pinger.period_take(answer.get("liveness_s"))
        self.policy_take(answer)
        found = self.watchdog(self.policy)
        if found:
            try:
                self.control_plane.call("POST", "/violations/", {"violations": [v.to_dict() for v in found]})
            except ControlPlaneError as exc:  # acted on already; the commands must still run this turn
                log.warning("could not report %d violation(s): %s", len(found), exc)
        if answer.get("commands_waiting") is False:  # said so; a control plane that does not say is asked
            return 0
        commands = self.control_plane.call("GET", "/commands/").get("commands", [])
        for command in commands:
            self.control_plane.call("POST", f"/commands/{command['id']}/result/", self.execute(command))
        return len(commands)

    def policy_take(self, answer: dict) -> None:
        """
        Keep the policy a heartbeat's answer brought, or the one held when the answer left it out
        (unchanged). A control plane that sends no version (an older one) sends the policy every
        time; an answer whose version is not the held one but brings no policy makes the next
        heartbeat ask for it whole, and the held policy is enforced meanwhile.
        """
        version = answer.get("policy_version")
        if "policy" in answer:
            self.policy = answer["policy"] or []
            self.policy_version = version if isinstance(version, str) else None
        elif version != self.policy_version:
            self.policy_version = None

    def execute(self, command: dict) -> dict:
        try:
            if command["kind"] == "scrub":
                problems = [p for d in command["payload"]["devices"] if (p := self.scrub(d))]
                return {"ok": not problems, "detail": "; ".join(problems)}
            if command["kind"] == "reset_gpu":
                problem = self.reset_gpu(int(command["payload"]["index"]))
                return {"ok": not problem, "detail": problem}
            if command["kind"] == "inventory":
                return {"ok": True, "gpus": self.inventory()}
            if command["kind"] == "mig":
                problem = self.set_mig_layout(int(command["payload"]["index"]), str(command["payload"]["layout"]))
                return {"ok": not problem, "detail": problem}
            if command["kind"] == "acceptance":
                return {"ok": True, **self.acceptance(str(command["payload"].get("model", "")))}
            if command["kind"] == "attest":
                if self.attester is None:
                    return {"ok": False, "detail": "this agent has no attestation backend"}
                wanted = set(command["payload"]["gpus"])
                gpus = [gpu for gpu in self.nvml.inventory() if gpu["index"] in wanted]
                return {
                    "ok": True,
                    "evidence": self.attester.evidence(self.hostname, command["payload"]["nonce"], gpus),
                }
            return {"ok": False, "detail": f"unknown command {command['kind']!r}"}
        except Exception as exc:  # one bad command must not stop the agent: report it
            log.exception("command %s failed", command.get("id"))
            return {"ok": False, "detail": f"{type(exc).__name__}: {exc}"}

    def heartbeat(self) -> dict:
        """
        What a heartbeat carries: the inventory, a sample of every GPU, the state of every IB port,
        and the version of the policy held (none before the first answer).
        """
        gpus = self.inventory()
        body = {"agent_version": self.version, "gpus": gpus, "samples": self.samples(gpus)}
        if self.ports is not None:
            body["ports"] = self.ports.states()
        if self.policy_version is not None:
            body["policy_version"] = self.policy_version
        return body

    def samples(self, gpus: list[dict]) -> list[dict]:
        """
        One sample per GPU: utilization, memory, temperature, power, ECC counters (cumulative),
        process count and the XIDs raised since the last sample. A reading the GPU does not offer
        is None; a GPU whose readings fail is left out (the control plane sees it missing).
        """
        nvml, found = self.nvml, []
        for gpu in gpus:
            index = gpu["index"]
            try:
                memory, ecc, processes = nvml.memory(index) or {}, nvml.ecc(index) or {}, nvml.processes(index)
                links = nvml.nvlinks(index) or {}
                sample = {
                    "uuid": gpu["uuid"],
                    "utilization_pct": nvml.utilization(index),
                    "memory_used_mib": memory.get("used_mib"),
                    "memory_total_mib": memory.get("total_mib"),
                    "temperature_c": nvml.temperature(index),
                    "power_w": nvml.power(index),
                    "ecc_corrected": ecc.get("corrected"),
                    "ecc_uncorrected": ecc.get("uncorrected"),
                    "processes": None if processes is None else len(processes),
                    "nvlink_up": links.get("up"),
                    "nvlink_total": links.get("total"),
                    "time_slice_ms": self.slicer.in_force(index),
                }
                # Last: a reading failing above loses no XID.
                sample["xids"] = (self.unsent_xids.pop(gpu["uuid"], []) + (nvml.xids(index) or []))[:MAX_XIDS]
            except NVMLReadError as exc:
                log.error("NVML, GPU %s: %s", index, exc)
                continue
            found.append(sample)
        return found

    def inventory(self) -> list[dict]:
        """The GPUs as NVML sees them, with the MIG layout each was cut into (MIG on) and its place in the node."""
        gpus = self.nvml.inventory()
        places = self.places([gpu["index"] for gpu in gpus])
        return [{**gpu, "mig_layout": self.current_layout(gpu["index"]), **places.get(gpu["index"], {})}
                for gpu in gpus]

    def places(self, indexes: list[int]) -> dict[int, dict]:
        """
        Where each GPU sits in the node (agent.topology): read once, as it changes only with the
        hardware, and again when the GPUs NVML lists change. A read that fails is logged and
        reported as nothing known: the heartbeat goes on, and the next one reads again.
        """
        if set(self._places) != set(indexes):
            try:
                self._places = topology.read(self.nvml, indexes)
            except Exception as exc:  # best effort: a topology is never worth a lost heartbeat
                log.warning("could not read where the GPUs sit: %s", exc)
                return {}
        return self._places

    def current_layout(self, index: int) -> str | None:
        mode = self.nvml.mig_mode(index)
        return self.mig_layouts.get(index) if mode and mode[0] else None

    def set_mig_layout(self, index: int, layout: str) -> str:
        """Cut GPU ``index`` into ``layout``: the host's MIG command, or the simulated GPU's mode; "" when done."""
        if self.mig_command:
            command = [p.replace("{index}", str(index)).replace("{layout}", layout) for p in self.mig_command]
            done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)  # noqa: S603
            if done.returncode:
                return f"GPU {index}: the MIG command failed ({done.returncode}): {done.stderr.strip()[:200]}"
        elif hasattr(self.nvml, "gpus"):
            self.nvml.gpus[index].mig = (True, True)
        else:
            return "this host has no MIG command configured (--mig-command)"
        self.mig_layouts[index] = layout
        return ""

    def reset_gpu(self, index: int) -> str:
        """
        Reset one GPU after a hardware error (failure detection asks), the same way a scrub resets
        it: the host's scrub command, or a simulated GPU cleared whole. Returns what is wrong ("" when
        the GPU is back: nothing runs on it and it reports healthy); the control plane escalates then.
        """
        if self.scrub_command:
            command = [part.replace("{index}", str(index)) for part in self.scrub_command]
            done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)  # noqa: S603
            if done.returncode:
                return f"GPU {index}: the reset command failed ({done.returncode}): {done.stderr.strip()[:200]}"
        else:
            gpu = next((g for g in self.nvml.inventory() if g["index"] == index), None)
            if gpu is None:
                return f"GPU {index}: not found"
            self.nvml.scrub(index, 0, gpu["memory_mib"])
        if self.nvml.processes(index):
            return f"GPU {index}: processes still running after the reset"
        gpu = next((g for g in self.nvml.inventory() if g["index"] == index), None)
        if gpu is None or not gpu.get("healthy", True):
            return f"GPU {index}: still unhealthy after the reset"
        return ""

    def scrub(self, device: dict) -> str:
        """
        Clear one GPU (or slot) after its tenant, then verify: no process on it, memory in use back
        to the baseline. Returns what is wrong ("" when clean); the control plane quarantines it then.
        A GPU other reservations still hold is never reset under them: only the slot is cleared.
        """
        index = device["index"]
        if device.get("neighbours"):
            return self.scrub_slot(device)
        if self.scrub_command:
            command = [part.replace("{index}", str(index)) for part in self.scrub_command]
            done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)  # noqa: S603
            if done.returncode:
                return f"GPU {index}: the scrub command failed ({done.returncode}): {done.stderr.strip()[:200]}"
        elif not self.nvml.scrub(index, device["mem_lo"], device["mem_hi"]):
            return f"GPU {index}: memory still in use after the scrub"
        left = self.nvml.processes(index) or []
        if left:
            return f"GPU {index}: {len(left)} process(es) still running after the scrub"
        memory = self.nvml.memory(index)
        if memory is not None and memory["used_mib"] > self.baseline_mib:
            return f"GPU {index}: {memory['used_mib']} MiB in use after the scrub (baseline {self.baseline_mib} MiB)"
        return ""

    def acceptance(self, model: str) -> dict:
        """The acceptance readings of every GPU (NVML at idle, then its stress steps) and the node's fabric tests."""
        gpus = [{**acceptance.readings(self.nvml, gpu["index"], model=model),
                 **acceptance.stress(self.stress_command, self.nvml, gpu["index"])} for gpu in self.nvml.inventory()]
        return {"gpus": gpus, "node": acceptance.fabric(self.fabric_test_command, self.nvml, model)}

    def scrub_slot(self, device: dict) -> str:
        """
        Clear one tenant's slot of a GPU others still use: stop what is left of the slot's owner,
        clear its memory range (the host's slot-scrub command, or the simulated GPU's range), and
        verify the slot by its own accounting -- none of the owner's processes, none of their memory
        -- never by the whole GPU's, which counts the neighbours' work.
        """
        index, owner, aliases = device["index"], device.get("owner"), device.get("aliases") or {}
        lo, hi = device["mem_lo"], device["mem_hi"]

        def mine() -> list[dict]:
            return [p for p in self.nvml.processes(index) or []
                    if owner and _alias(aliases, self.process_owner(p["pid"])) == owner]

        for process in mine():
            self.kill(index, process["pid"])
        if self.slot_scrub_command:
            command = [part.replace("{index}", str(index)).replace("{mem_lo}", str(lo)).replace("{mem_hi}", str(hi))
                       for part in self.slot_scrub_command]
            done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)  # noqa: S603
            if done.returncode:
                return f"GPU {index}: the slot scrub command failed ({done.returncode}): {done.stderr.strip()[:200]}"
        elif hasattr(self.nvml, "gpus"):
            if not self.nvml.scrub(index, lo, hi):
                return f"GPU {index}: MiB {lo}-{hi} still hold data after the slot scrub"
        else:
            return (f"GPU {index} is shared with {device['neighbours']} other reservation(s) and this host has no "
                    "--slot-scrub-command: the slot cannot be cleared without resetting their work")
        left = mine()
        if left:
            held = sum(p.get("used_memory_mib") or 0 for p in left)
            return f"GPU {index}: {len(left)} process(es) of {owner} still hold {held} MiB after the slot scrub"
        return ""

    def watchdog(self, policy: list[dict]) -> list:
        """
        Judge what runs on each GPU against its policy (security.isolation) and act at once: a
        foreign process is killed, an owner over its cap has its processes on that GPU stopped;
        a wrong MIG layout is reported (the control plane quarantines the GPU).
        """
        found = []
        for entry in policy:
            gpu = GPUPolicy.from_dict(entry)
            aliases = entry.get("aliases") or {}  # a pod's UID -> its instance
            processes = [
                Process(
                    pid=p["pid"],
                    owner=_alias(aliases, self.process_owner(p["pid"])),
                    used_memory_mib=p.get("used_memory_mib") or 0,
                )
                for p in (self.nvml.processes(gpu.index) or [])
            ]
            if gpu.time_slice_ms and gpu.owners:
                self.slicer.apply(gpu.index, gpu.time_slice_ms)  # what stays wrong is reported below
            violations = evaluate(gpu, processes, mig_layout=self.current_layout(gpu.index),
                                  time_slice_ms=self.slicer.in_force(gpu.index))
            for violation in violations:
                if violation.action in (KILL_PROCESS, STOP_CONTAINER):
                    for pid in violation.pids:
                        self.kill(gpu.index, pid)
            found += violations
        return found

    def run(self, interval: float = 10.0, stop=lambda: False) -> None:
        if self.pinger is not None:
            self.pinger.start(stop)
        while not stop():
            try:
                self.run_once()
            except ControlPlaneError as exc:
                log.warning("control plane: %s", exc)
            except NVMLReadError as exc:  # a GPU gone: say so and keep the loop (the heartbeat stops showing it)
                log.error("NVML: %s", exc)
            self._sleep(self.interval or interval, stop)
        if self.pinger is not None:
            self.pinger.leave()

    @staticmethod
    def _sleep(seconds: float, stop) -> None:
        """Sleep until the next turn, waking early when told to stop (then the pings end in order)."""
        until = time.monotonic() + seconds
        while not stop() and time.monotonic() < until:
            time.sleep(min(0.2, max(until - time.monotonic(), 0.0)))


# A process's cgroup names what runs it: a libvirt domain (machine-qemu\x2dN\x2d<domain>.scope) or
# a container scope whose name Meridian gave it. Anything else belongs to no instance Meridian knows.
_DOMAIN = re.compile(r"machine-qemu\\x2d\d+\\x2d(?P<name>[^/]+?)\.scope")
_MERIDIAN_NAME = re.compile(r"(?P<name>r[0-9a-f]{12}-\d+)")


# Kubernetes puts a pod's processes under kubepods...pod<UID> (systemd writes the UID's dashes as _).
_POD = re.compile(r"pod(?P<uid>[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")


def cgroup_owner(pid: int) -> str | None:
    """The instance a host process belongs to, from /proc/<pid>/cgroup; None when it is nobody's."""
    try:
        with open(f"/proc/{int(pid)}/cgroup", encoding="utf-8") as handle:
            return owner_from_cgroup(handle.read())
    except OSError:
        return None


def owner_from_cgroup(text: str) -> str | None:
    """A libvirt domain's name, a pod's UID, or a scope Meridian named; None for anything else."""
    if match := _DOMAIN.search(text):
        return match.group("name").replace("\\x2d", "-")
    if match := _POD.search(text):
        return match.group("uid").replace("_", "-")
    match = _MERIDIAN_NAME.search(text)
    return match.group("name") if match else None


def _alias(aliases: dict, owner: str | None) -> str | None:
    return aliases.get(owner, owner) if owner else owner


def kill_process(index: int, pid: int) -> None:
    """Stop a process on GPU ``index`` at once (the agent runs as the host's root)."""
    with contextlib.suppress(ProcessLookupError):  # gone already
        os.kill(int(pid), signal.SIGKILL)


def simulated_host(nvml) -> tuple:
    """(process_owner, kill) over a SimulatedNVML's processes, each of which may carry its "owner"."""

    def owner(pid: int) -> str | None:
        return next((p.get("owner") for gpu in nvml.gpus.values() for p in gpu.processes if p["pid"] == pid), None)

    def kill(index: int, pid: int) -> None:
        gpu = nvml.gpus[index]
        gpu.processes = [p for p in gpu.processes if p["pid"] != pid]

    return owner, kill
