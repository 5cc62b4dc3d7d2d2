"""
The failure-detection policy, as pure functions: samples and times in, findings out.

What counts as a failure is configuration, not a hard-coded list (``MERIDIAN_FAILURE_POLICY``):
how many missed heartbeats (or liveness pings, for an agent that sends them) make a node
suspect and then faulty, when the control plane's own stall holds that judgement, what each XID
class means (NVIDIA's application-level XIDs such as 13, 31, 43, 45, 68 and 109 are the tenant's
program, not the hardware, and never take a node out), how many XIDs within a window escalate,
the temperature limit, and how many link changes make an InfiniBand port "flapping". The services in
``operations.detection`` act on the findings (incidents, resets, drains, replacement).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import IntEnum
from typing import Any


class Action(IntEnum):
    """What a finding asks for, mildest first (a GPU's findings resolve to the strongest)."""

    IGNORE = 0
    RESET_GPU = 1  # reset that GPU through the node agent; it comes back if it recovers
    DRAIN_NODE = 2  # stop selling the node; its tenants' work runs on (they are told), then an operator hold
    # Faulty now: what runs on it is replaced, then repair and validation. A GPU's finding on a
    # shared host fails that GPU (the host's other tenants go on); on a bare-metal server, the server.
    FAULTY = 3

    @classmethod
    def parse(cls, value: str | int | Action) -> Action:
        if isinstance(value, Action):
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            return cls(value)
        try:
            return cls[str(value).strip().upper()]
        except KeyError:
            raise ValueError(f"unknown action {value!r}: use one of {', '.join(a.name.lower() for a in cls)}") from None


# NVIDIA's XID catalogue, reduced to what a control plane does about each. Application-level
# errors are ignored; ECC and GSP errors want a reset; a GPU off the bus or a failed row remap is
# hardware that must be repaired; NVLink errors take the node (its GPUs are linked).
DEFAULT_XID_ACTIONS: dict[int, Action] = {
    13: Action.IGNORE, 31: Action.IGNORE, 43: Action.IGNORE, 45: Action.IGNORE, 68: Action.IGNORE,
    109: Action.IGNORE, 63: Action.IGNORE,
    48: Action.RESET_GPU, 61: Action.RESET_GPU, 62: Action.RESET_GPU, 92: Action.RESET_GPU, 94: Action.RESET_GPU,
    95: Action.RESET_GPU, 119: Action.RESET_GPU, 120: Action.RESET_GPU,
    74: Action.DRAIN_NODE,
    64: Action.FAULTY, 79: Action.FAULTY,
}


@dataclass(frozen=True)
class FailurePolicy:
    heartbeat_interval_s: float = 10.0
    # Two silent periods stop the node being sold; the third fails it and its tenants are moved:
    # "detected in three periods" is when replacement starts, not merely a suspicion.
    suspect_after_misses: int = 2
    faulty_after_misses: int = 3
    xid_actions: Mapping[int, Action] = field(default_factory=lambda: dict(DEFAULT_XID_ACTIONS))
    unknown_xid_action: Action = Action.RESET_GPU
    # The same GPU showing this many non-ignored XIDs within the window is not recovering.
    repeated_xids: int = 3
    repeated_xid_window_s: float = 3600.0
    repeated_xid_action: Action = Action.FAULTY
    max_temperature_c: int = 90
    over_temperature_action: Action = Action.DRAIN_NODE
    uncorrectable_ecc_action: Action = Action.RESET_GPU
    port_down_action: Action = Action.DRAIN_NODE
    # An NVLink link down: multi-GPU work on the host slows or fails, single-GPU work runs on.
    nvlink_down_action: Action = Action.DRAIN_NODE
    port_flaps: int = 4
    port_flap_window_s: float = 300.0
    # A GPU whose reset failed, or that fails again after a reset that seemed to work.
    reset_failed_action: Action = Action.FAULTY
    # Out of band (bare metal a tenant holds): the BMC reports the system critical; a handed-over
    # server is off.
    bmc_critical_action: Action = Action.FAULTY
    # Drain, not faulty: one reading of "off" cannot tell a lost server from the tenant's own
    # ``poweroff`` (or a reboot caught between off and on), and failing it would move the tenant's
    # work and send a sound server to repair. Drained, it is not sold again once the reservation
    # ends and nothing is replaced; operators who want replacement set this to faulty.
    power_lost_action: Action = Action.DRAIN_NODE
    # When at least this many of a region's watched nodes, and more than this share of them, are
    # silent at once, the likelier cause is the control plane's own network, not the nodes (the
    # Kubernetes node controller stops evicting from a zone in "full disruption" for the same
    # reason): they are made suspect -- not sold -- but none is failed or has its running work moved
    # until the region is under half the share; then those still silent get the usual number of
    # periods, counted from the release, to be heard. One platform incident says so.
    mass_silence_share: float = 0.5
    mass_silence_min_nodes: int = 5
    # An agent that pings (operations.node_api.liveness) is judged by its pings' period, not its
    # heartbeats'; None: no agent pings.
    liveness_interval_s: float | None = 2.0
    # The control plane's own stall (control_plane_stall): a watchdog round later than its schedule
    # by more than stall_slack_s, a first statement slower than stall_database_s, or many agents'
    # pings late at once -- more than stall_share of those pinging say their last pings went
    # unanswered or slow, or all but that share went quiet. Judgement is held while it lasts (at
    # most stall_max_s) and silence counted from its end.
    stall_slack_s: float = 1.0
    stall_database_s: float = 1.0
    stall_share: float = 0.2
    stall_max_s: float = 60.0

    def __post_init__(self):
        if not 0 < self.suspect_after_misses <= self.faulty_after_misses:
            raise ValueError("need 0 < suspect_after_misses <= faulty_after_misses")
        if not 0 < self.mass_silence_share < 1 or self.mass_silence_min_nodes < 1:
            raise ValueError("need 0 < mass_silence_share < 1 and mass_silence_min_nodes >= 1")
        if self.heartbeat_interval_s <= 0 or (self.liveness_interval_s is not None and self.liveness_interval_s <= 0):
            raise ValueError("heartbeat_interval_s and liveness_interval_s must be positive")
        if min(self.stall_slack_s, self.stall_database_s, self.stall_max_s) <= 0 or not 0 < self.stall_share < 0.5:
            raise ValueError("need positive stall_slack_s, stall_database_s and stall_max_s, and 0 < stall_share < 0.5")
        if self.repeated_xids < 1 or self.port_flaps < 1:
            raise ValueError("repeated_xids and port_flaps must be at least 1")

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any] | None, *, heartbeat_interval_s: float | None = None,
                     liveness_interval_s: float | None = None):
        """The policy from a settings dict (JSON); XID keys may be strings, actions names."""
        values = dict(values or {})
        if heartbeat_interval_s is not None:
            values.setdefault("heartbeat_interval_s", heartbeat_interval_s)
        if liveness_interval_s is not None:  # 0: no pings
            values.setdefault("liveness_interval_s", liveness_interval_s or None)
        unknown = set(values) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown failure policy keys: {', '.join(sorted(unknown))}")
        xids = dict(DEFAULT_XID_ACTIONS)
        for xid, action in (values.pop("xid_actions", None) or {}).items():
            xids[int(xid)] = Action.parse(action)
        for name in ("unknown_xid_action", "repeated_xid_action", "over_temperature_action",
                     "uncorrectable_ecc_action", "port_down_action", "reset_failed_action", "bmc_critical_action",
                     "power_lost_action", "nvlink_down_action"):
            if name in values:
                values[name] = Action.parse(values[name])
        return cls(xid_actions=xids, **values)


@dataclass(frozen=True)
class Finding:
    action: Action
    cause: str  # a stable code: xid_79, uncorrectable_ecc, over_temperature, nvlink_down, port_down, ...
    summary: str
    evidence: dict


def counted_xids(xids, policy: FailurePolicy) -> int:
    """How many of ``xids`` count towards repeated XIDs (every one the policy does not ignore)."""
    return sum(1 for xid in xids or () if policy.xid_actions.get(int(xid), policy.unknown_xid_action) != Action.IGNORE)


def mass_silence(silent: int, watched: int, policy: FailurePolicy, *, held: bool = False) -> bool:
    """
    Whether ``silent`` of a region's ``watched`` nodes look like a lost network rather than lost
    nodes. A region already ``held`` stays held until under half the share: a network coming back
    in pieces must not release it at the first node heard and fail all the others at once.
    """
    share = policy.mass_silence_share / 2 if held else policy.mass_silence_share
    return silent >= policy.mass_silence_min_nodes and silent > share * watched


@dataclass(frozen=True)
class Round:
    """What one watchdog round saw of itself and of the agents' pings (``control_plane_stall``)."""

    gap_s: float | None  # since the round before began; None: none known
    schedule_s: float  # how often rounds are meant to begin
    database_s: float  # how long its first statement took
    pinging: int = 0  # watched nodes whose agents ping
    late: int = 0  # of them, not heard for over a liveness period and the slack
    distressed: int = 0  # of them heard lately, those whose last ping says earlier ones went unanswered or slow


def control_plane_stall(seen: Round, policy: FailurePolicy) -> str | None:
    """
    Why this round cannot tell silent nodes from a stalled control plane, or None. Pings late
    because of the control plane's own load look, from the database, like nodes gone quiet; what
    tells them apart is the control plane's own state: its watchdog late, its database slow, or
    agents in every part of the fleet late at once -- a rack losing power silences its nodes and
    leaves the others' pings prompt, a busy web tier or database delays everyone's.
    """
    if seen.gap_s is not None and seen.gap_s > seen.schedule_s + policy.stall_slack_s:
        return "watchdog_late"
    if seen.database_s > policy.stall_database_s:
        return "database_slow"
    floor = policy.mass_silence_min_nodes
    if seen.distressed >= floor and seen.distressed > policy.stall_share * seen.pinging:
        return "pings_late"
    if seen.late >= floor and seen.late > (1 - policy.stall_share) * seen.pinging:
        return "pings_stopped"
    return None


def heartbeat_state(last_seen: datetime | None, now: datetime, policy: FailurePolicy) -> str:
    """``ok``, ``suspect`` or ``faulty`` by the number of whole heartbeat periods missed."""
    if last_seen is None:
        return "ok"  # never seen: not started yet, which validation deals with
    missed = int((now - last_seen).total_seconds() // policy.heartbeat_interval_s)
    if missed >= policy.faulty_after_misses:
        return "faulty"
    if missed >= policy.suspect_after_misses:
        return "suspect"
    return "ok"


def evaluate_gpu(*, sample: Mapping, previous: Mapping | None, recent_xids: int,
                 policy: FailurePolicy) -> list[Finding]:
    """
    Findings for one GPU sample. ``previous`` is the GPU's last sample (for the ECC counter);
    ``recent_xids`` counts its non-ignored XIDs already seen inside the repeat window.
    """
    findings = []
    counted = 0
    for xid in sample.get("xids") or ():
        action = policy.xid_actions.get(int(xid), policy.unknown_xid_action)
        if action == Action.IGNORE:
            continue
        counted += 1
        findings.append(Finding(action, f"xid_{xid}", f"XID {xid}", {"xid": int(xid)}))
    if counted and recent_xids + counted >= policy.repeated_xids:
        findings.append(Finding(policy.repeated_xid_action, "repeated_xids",
                                f"{recent_xids + counted} XIDs within {policy.repeated_xid_window_s / 60:g} min",
                                {"xids": recent_xids + counted, "window_s": policy.repeated_xid_window_s}))
    now_ecc, before_ecc = sample.get("ecc_uncorrected"), (previous or {}).get("ecc_uncorrected")
    if now_ecc is not None and before_ecc is not None and now_ecc > before_ecc:
        findings.append(Finding(policy.uncorrectable_ecc_action, "uncorrectable_ecc",
                                f"{now_ecc - before_ecc} new uncorrectable ECC errors",
                                {"ecc_uncorrected": now_ecc, "before": before_ecc}))
    temperature = sample.get("temperature_c")
    if temperature is not None and temperature > policy.max_temperature_c:
        findings.append(Finding(policy.over_temperature_action, "over_temperature",
                                f"{temperature} °C over the {policy.max_temperature_c} °C limit",
                                {"temperature_c": temperature, "limit_c": policy.max_temperature_c}))
    up, links = sample.get("nvlink_up"), sample.get("nvlink_total")
    if up is not None and links and up < links:
        findings.append(Finding(policy.nvlink_down_action, "nvlink_down", f"{links - up} of {links} NVLink links down",
                                {"nvlink_up": up, "nvlink_total": links}))
    return findings


def evaluate_port(*, link: str, changes_in_window: int, policy: FailurePolicy) -> Finding | None:
    """A port that is down, or that changed state ``port_flaps`` times inside the window."""
    if changes_in_window >= policy.port_flaps:
        return Finding(policy.port_down_action, "port_flapping",
                       f"link changed {changes_in_window} times in {policy.port_flap_window_s / 60:g} min",
                       {"changes": changes_in_window, "window_s": policy.port_flap_window_s})
    if link == "down":
        return Finding(policy.port_down_action, "port_down", "InfiniBand link down", {"link": link})
    return None


def strongest(findings: list[Finding]) -> Finding | None:
    return max(findings, key=lambda f: f.action, default=None)
