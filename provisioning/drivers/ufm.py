"""
NVIDIA UFM Enterprise as the fabric driver: partitions through UFM's REST API (basic auth,
everything under ``/ufmRest``).

The calls and bodies follow the NVIDIA UFM Enterprise REST API Guide, "PKey GUIDs Rest API"
(docs.nvidia.com/networking/display/UFMEnterpriseRESTAPILatest/PKey+GUIDs+Rest+API, v6.11-v6.24):

- ``GET  /ufmRest/resources/pkeys?guids_data=true`` and ``?qos_conf=true``: every P_Key, keyed
  ``"0x7fff"``-style, with ``partition`` (its name), ``ip_over_ib``, ``guids`` (``guid``,
  ``membership``, ``index0``) or ``qos_conf`` (``mtu_limit``, ``service_level``, ``rate_limit``).
  The two flags are asked for separately: NVIDIA's own client notes that UFM does not answer both
  at once on the list (NVIDIA bug 5409095, in NVIDIA/bare-metal-manager's ufmclient).
- ``GET  /ufmRest/resources/pkeys/<pkey>?guids_data=true&qos_conf=true``: one P_Key; UFM answers
  200 with ``{}`` when there is none (the same client and Mellanox/ib-kubernetes rely on that).
- ``POST /ufmRest/resources/pkeys/add``: an empty P_Key (``pkey``, ``partition_name``, ``index0``,
  ``ip_over_ib``, ``mtu_limit``, ``service_level``, ``rate_limit``; only ``pkey`` is required).
- ``POST /ufmRest/resources/pkeys``: add GUIDs (``guids``, ``pkey``, ``ip_over_ib``, ``index0``,
  and ``memberships``, one ``full``/``limited`` per GUID).
- ``PUT  /ufmRest/resources/pkeys/qos_conf``: a P_Key's ``mtu_limit``/``service_level``/``rate_limit``.
- ``DELETE /ufmRest/resources/pkeys/<pkey>/guids/<guid>,<guid>``: remove GUIDs. The guide marks the
  older ``POST /ufmRest/actions/remove_guids_from_pkey`` deprecated, so it is not used here.
- ``DELETE /ufmRest/resources/pkeys/<pkey>``: the P_Key and its memberships.

Port link states (what watches a bare-metal node a tenant holds) come from the "Ports REST API":
``GET /ufmRest/resources/ports``, a list of every port of the fabric with ``guid``, ``name``
(``<port GUID>_<port number>``), ``logical_state`` (``Active``, ``Down``, ``Init``, ``Armed`` or
``N/A``) and ``physical_state`` (``LinkUp``/``Link Up``, ``Polling``, ``Disabled``, ...); only
hosts' ports are asked for (``?sys_type=Computer``). A port is up when it is logically Active and
down when logically Down or physically not linked; Init and Armed (a link being brought up, before
the subnet manager's next sweep) tell nothing yet.

P_Keys go to UFM as ``"0x"`` + lower-case hex without padding (what UFM itself answers, e.g.
``"0x2fb"``); GUIDs as the 16 lower-case hex digits UFM reports (the guide accepts 16-20 hex
characters). MTUs are IB MTU codes 1-5 (256-4096 bytes) and rates are Gb/s numbers.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

import requests

from cloud.guids import normal_guid
from provisioning.drivers.base import DriverError
from provisioning.drivers.fabric import (
    DEFAULT_PKEY,
    FULL,
    LIMITED,
    MTUS,
    PKEY_MAX,
    PKEY_MIN,
    RATE_CODES,
    FabricDriver,
    Partition,
    PartitionSpec,
    check_members,
)

log = logging.getLogger(__name__)

API = "/ufmRest/resources/pkeys"
PORTS = "/ufmRest/resources/ports"
LOGICAL_DOWN = {"down"}
PHYSICAL_DOWN = {"polling", "disabled", "down", "sleep", "phytest", "linkerrorrecovery"}
# GUIDs per DELETE .../guids/<list>: they travel in the URL path, which servers cap (~8 KiB).
REMOVE_BATCH = 100
# Answers worth retrying besides 5xx: timeout and throttling.
RETRYABLE = {408, 429}


def pkey_text(pkey: int) -> str:
    """A P_Key as UFM writes it: ``0x`` and lower-case hex, no padding (``0x7fff``, ``0x12``)."""
    return f"{pkey:#x}"


def mtu_code(mtu: int) -> int:
    """Bytes to the IB MTU code UFM's ``mtu_limit`` takes (256 -> 1 ... 4096 -> 5)."""
    return MTUS.index(mtu) + 1


def mtu_bytes(code) -> int:
    """UFM's ``mtu_limit`` code back to bytes; DriverError when UFM reports one we do not know."""
    if isinstance(code, int) and 1 <= code <= len(MTUS):
        return MTUS[code - 1]
    raise DriverError(f"UFM reported mtu_limit {code!r}, not an IB MTU code 1-5; check the partition in UFM.",
                      transient=False)


def rate_gbps(value) -> float | None:
    """UFM's ``rate_limit`` as one of our rates, None when it is not one (UFM's own default)."""
    return float(value) if isinstance(value, int | float) and value in RATE_CODES else None


def check_pkey(pkey: int, action: str) -> int:
    """A tenant P_Key (0x0001-0x7FFE) or DriverError, before any request is sent."""
    if isinstance(pkey, bool) or not isinstance(pkey, int) or not PKEY_MIN <= pkey <= PKEY_MAX:
        shown = f"{pkey:#06x}" if isinstance(pkey, int) else repr(pkey)
        raise DriverError(f"Cannot {action} P_Key {shown}: it is outside 0x0001-0x7FFE.", transient=False)
    return pkey


def index0_for(membership: str) -> bool:
    """
    Whether UFM stores the P_Key at index 0 of the port's P_Key table. A port is a full member of
    its tenant's partition only, so that one becomes the port's default P_Key (what NVIDIA's
    bare-metal manager does); partitions it joins as a limited member never take index 0.
    """
    return membership == FULL


def port_guids(port) -> set[str]:
    """The GUIDs a UFM port answers to: its ``guid`` and the one its ``name`` (``<guid>_<number>``) starts with."""
    if not isinstance(port, dict):
        return set()
    found = set()
    for value in (port.get("guid"), str(port.get("name") or "").split("_")[0]):
        try:
            found.add(normal_guid(value))
        except ValueError:
            continue
    return found


def link_state(port) -> str | None:
    """``up`` or ``down`` from a UFM port's logical state, else its physical one; None when it tells neither."""
    if not isinstance(port, dict):
        return None
    logical = str(port.get("logical_state") or "").replace(" ", "").lower()
    physical = str(port.get("physical_state") or "").replace(" ", "").lower()
    if logical == "active":
        return "up"
    if logical in LOGICAL_DOWN or physical in PHYSICAL_DOWN:
        return "down"
    if physical == "linkup" and logical in ("", "n/a"):
        return "up"
    return None  # Init or Armed: coming up, not usable yet, not a fault either


class UFMFabric(FabricDriver):
    """One UFM-managed InfiniBand fabric; every method is safe to repeat."""

    def __init__(self, *, url: str, username: str, password: str, verify_tls: bool = True,
                 timeout_s: float = 10.0):
        self.url = url.rstrip("/")
        self.username = username
        self._password = password
        self.timeout_s = timeout_s
        self.session = requests.Session()
        self.session.auth = (username, password)
        self.session.verify = verify_tls
        self.session.headers.update({"Accept": "application/json"})

    def __repr__(self):
        return f"UFMFabric({self.url})"

    # -- the interface ---------------------------------------------------------------------------

    def read(self) -> dict[int, Partition]:
        with_guids = self._get(API, {"guids_data": "true"}) or {}
        with_qos = self._get(API, {"qos_conf": "true"}) or {}
        found = {}
        for key in {**with_qos, **with_guids}:
            pkey = self._parse_pkey(key)
            if pkey is None:
                continue
            merged = {**with_qos.get(key, {}), **with_guids.get(key, {})}
            found[pkey] = Partition(self._spec(pkey, merged), self._members(merged))
        return found

    def ensure_partition(self, spec: PartitionSpec) -> None:
        if not isinstance(spec, PartitionSpec):
            raise DriverError(f"ensure_partition needs a PartitionSpec, not {type(spec).__name__}.", transient=False)
        current = self._partition(spec.pkey)
        if spec.pkey == DEFAULT_PKEY:
            self._check_default(spec, current)
            return
        if current is None:
            current = self._create(spec)
            if current is None:
                return
        self._update_qos(spec, current)
        self._update_ipoib(spec, current)

    def delete_partition(self, pkey: int) -> None:
        if pkey == DEFAULT_PKEY:
            raise DriverError("The default partition 0x7fff cannot be deleted; UFM keeps it for every fabric.",
                              transient=False)
        check_pkey(pkey, "delete")
        self._call("DELETE", f"{API}/{pkey_text(pkey)}", what=f"delete P_Key {pkey_text(pkey)}", missing_ok=True)

    def set_members(self, pkey: int, members: Mapping[str, str]) -> None:
        checked = check_members(members)
        if pkey == DEFAULT_PKEY:
            self._default_members(checked)
            return
        check_pkey(pkey, "add ports to")
        if not checked:
            return
        current = self._partition(pkey)
        if current is None:
            raise DriverError(f"P_Key {pkey_text(pkey)} does not exist on UFM {self.url}; create it with "
                              "ensure_partition before adding ports.", transient=False)
        have = self._members(current)
        changed = {guid: m for guid, m in checked.items() if have.get(guid) != m}
        if changed:
            self._add_guids(pkey, changed, bool(current.get("ip_over_ib", True)))

    def remove_members(self, pkey: int, guids: Iterable[str]) -> None:
        gone = list(check_members({guid: FULL for guid in guids}))
        if pkey == DEFAULT_PKEY:
            self._remove_default(gone)
            return
        check_pkey(pkey, "remove ports from")
        current = self._partition(pkey) if gone else None
        if current is None:
            return
        have = self._members(current)
        present = [guid for guid in gone if guid in have]
        if not present:
            return
        for start in range(0, len(present), REMOVE_BATCH):
            batch = ",".join(present[start:start + REMOVE_BATCH])
            self._call("DELETE", f"{API}/{pkey_text(pkey)}/guids/{batch}",
                       what=f"remove ports from P_Key {pkey_text(pkey)}", missing_ok=True)
        if set(present) == set(have):
            self._keep_empty(pkey, current)

    # -- steps -----------------------------------------------------------------------------------

    def _create(self, spec: PartitionSpec) -> dict | None:
        """
        Create the empty P_Key. When UFM refuses because it appeared meanwhile (another worker),
        carry on with the one it has; anything else it refuses is reported.
        """
        body = {"pkey": pkey_text(spec.pkey), "partition_name": spec.name, "index0": False,
                "ip_over_ib": spec.ipoib, "mtu_limit": mtu_code(spec.mtu), "service_level": spec.service_level}
        if spec.rate_gbps is not None:
            body["rate_limit"] = spec.rate_gbps
        try:
            self._call("POST", f"{API}/add", json=body, what=f"create P_Key {pkey_text(spec.pkey)}")
        except DriverError:
            current = self._partition(spec.pkey)
            if current is None:
                raise
            return current
        return None

    def _update_qos(self, spec: PartitionSpec, current: dict) -> None:
        """PUT qos_conf when UFM's MTU, SL or rate differ; a rate of None keeps UFM's."""
        qos = current.get("qos_conf") or {}
        wanted = {"mtu_limit": mtu_code(spec.mtu), "service_level": spec.service_level,
                  "rate_limit": spec.rate_gbps if spec.rate_gbps is not None else qos.get("rate_limit")}
        if wanted["rate_limit"] is None:
            wanted.pop("rate_limit")
        if all(qos.get(k) == v for k, v in wanted.items()):
            return
        self._call("PUT", f"{API}/qos_conf", json={"pkey": pkey_text(spec.pkey), **wanted},
                   what=f"update QoS of P_Key {pkey_text(spec.pkey)}")

    def _update_ipoib(self, spec: PartitionSpec, current: dict) -> None:
        """
        UFM has no call that only flips ``ip_over_ib``: adding GUIDs sets it for the partition. So
        the members are posted again with the new value; an empty partition is created anew.
        """
        if bool(current.get("ip_over_ib", True)) == spec.ipoib:
            return
        members = self._members(current)
        if members:
            self._add_guids(spec.pkey, members, spec.ipoib)
            return
        self._call("DELETE", f"{API}/{pkey_text(spec.pkey)}", what=f"re-create P_Key {pkey_text(spec.pkey)}",
                   missing_ok=True)
        self._create(spec)

    def _add_guids(self, pkey: int, members: Mapping[str, str], ipoib: bool) -> None:
        """
        One POST for every GUID with its own membership (``memberships``). ``index0`` is one value
        per call, so full and limited members go in separate calls.
        """
        for membership in (FULL, LIMITED):
            guids = sorted(guid for guid, m in members.items() if m == membership)
            if not guids:
                continue
            body = {"pkey": pkey_text(pkey), "guids": guids, "memberships": [membership] * len(guids),
                    "ip_over_ib": ipoib, "index0": index0_for(membership)}
            self._call("POST", API, json=body, what=f"add {len(guids)} port(s) to P_Key {pkey_text(pkey)}")

    def _keep_empty(self, pkey: int, before: dict) -> None:
        """
        UFM deletes a P_Key when its last GUID is removed (seen in the field: NVIDIA
        nv-config-manager PR 72, and NVIDIA's UFM mock does the same). The interface keeps the
        partition until delete_partition, so it is created again, empty, with its settings.
        """
        if self._partition(pkey) is not None:
            return
        qos = before.get("qos_conf") or {}
        spec = PartitionSpec(pkey=pkey, name=str(before.get("partition") or pkey_text(pkey)),
                             mtu=mtu_bytes(qos.get("mtu_limit", mtu_code(4096))),
                             rate_gbps=rate_gbps(qos.get("rate_limit")),
                             service_level=int(qos.get("service_level", 0)),
                             ipoib=bool(before.get("ip_over_ib", True)))
        self._create(spec)

    def _check_default(self, spec: PartitionSpec, current: dict | None) -> None:
        """
        The guide takes P_Keys strictly between 0x0 and 0x7fff, and UFM's user manual calls 0x7fff
        its read-only management key: its settings are UFM's. Nothing to do when they already
        match the spec; otherwise say where to change them.
        """
        if current is None:
            raise DriverError(f"UFM {self.url} reports no default partition 0x7fff; check UFM's subnet manager.",
                              transient=True)
        have = self._spec(DEFAULT_PKEY, current)
        if (have.mtu, have.service_level, have.ipoib) == (spec.mtu, spec.service_level, spec.ipoib) and \
                spec.rate_gbps in (None, have.rate_gbps):
            return
        raise DriverError(f"UFM {self.url} manages the default partition 0x7fff itself (mtu {have.mtu}, sl "
                          f"{have.service_level}, ipoib {have.ipoib}); its REST API does not change it. Change it "
                          "in UFM's configuration or ask for the settings it has.", transient=False)

    def _default_members(self, members: dict[str, str]) -> None:
        """
        Every port is a member of 0x7fff, with the membership UFM is configured to give them (UFM
        6.19+ reports it as the partition's ``membership``). Limited is what tenant ports need; a
        port cannot be made a full member, nor limited while UFM gives full, through the API.
        """
        if not members:
            return
        full = sorted(guid for guid, m in members.items() if m == FULL)
        if full:
            raise DriverError(f"Tenant ports are never full members of the default partition 0x7fff (asked for "
                              f"{', '.join(full)}).", transient=False)
        current = self._partition(DEFAULT_PKEY) or {}
        default = current.get("membership")
        if default == LIMITED:
            return
        raise DriverError(f"UFM {self.url} gives ports {default or 'an unreported'} membership of the default "
                          "partition 0x7fff, so tenant ports could reach each other there. Configure UFM to make "
                          "host ports limited members of the default partition (UFM 6.19 or later reports it).",
                          transient=False)

    def _remove_default(self, guids: list[str]) -> None:
        """Ports cannot leave 0x7fff through UFM's API; those only there by UFM's default are ignored."""
        listed = self._members(self._partition(DEFAULT_PKEY) or {}) if guids else {}
        pinned = sorted(guid for guid in guids if guid in listed)
        if pinned:
            raise DriverError(f"Ports {', '.join(pinned)} are listed members of the default partition 0x7fff, "
                              "which UFM manages itself; remove them in UFM.", transient=False)

    # -- reading UFM's answers -------------------------------------------------------------------

    def _partition(self, pkey: int) -> dict | None:
        """One P_Key with its members and QoS, None when UFM has none (it answers ``{}``)."""
        found = self._get(f"{API}/{pkey_text(pkey)}", {"guids_data": "true", "qos_conf": "true"}, missing_ok=True)
        return found or None

    def _parse_pkey(self, key: str) -> int | None:
        """A P_Key from UFM's ``"0x12"`` key; None (logged) for one outside what the interface holds."""
        try:
            pkey = int(str(key), 16)
        except ValueError:
            log.warning("UFM %s reported a P_Key we cannot read: %r", self.url, key)
            return None
        if pkey == DEFAULT_PKEY or PKEY_MIN <= pkey <= PKEY_MAX:
            return pkey
        log.warning("UFM %s reported P_Key %s outside 0x0001-0x7FFF; ignored", self.url, key)
        return None

    def _spec(self, pkey: int, data: dict) -> PartitionSpec:
        """Our PartitionSpec from UFM's ``partition``, ``ip_over_ib`` and ``qos_conf``."""
        qos = data.get("qos_conf") or {}
        return PartitionSpec(pkey=pkey, name=str(data.get("partition") or pkey_text(pkey)),
                             mtu=mtu_bytes(qos.get("mtu_limit", mtu_code(4096))),
                             rate_gbps=rate_gbps(qos.get("rate_limit")),
                             service_level=int(qos.get("service_level", 0)),
                             ipoib=bool(data.get("ip_over_ib", True)))

    def _members(self, data: dict) -> dict[str, str]:
        """UFM's ``guids`` list as normal GUID -> membership; entries we cannot read are logged and skipped."""
        members = {}
        for entry in data.get("guids") or []:
            try:
                guid = normal_guid(entry["guid"])
            except (KeyError, TypeError, ValueError):
                log.warning("UFM %s reported a member we cannot read: %r", self.url, entry)
                continue
            members[guid] = LIMITED if entry.get("membership") == LIMITED else FULL
        return members

    def port_states(self, guids: Iterable[str]) -> dict[str, str]:
        wanted = set()
        for guid in guids:
            try:
                wanted.add(normal_guid(guid))
            except ValueError as exc:  # a bad stored GUID must not hide the other ports' states
                log.warning("UFM %s: skipping port %r: %s", self.url, guid, exc)
        if not wanted:
            return {}
        answer = self._get(PORTS, {"sys_type": "Computer"})
        if not isinstance(answer, list):
            raise DriverError(f"UFM {self.url} answered {PORTS} with {type(answer).__name__}, not a list of ports; "
                              "is this UFM Enterprise?", transient=True)
        states = {}
        for port in answer:
            state = link_state(port)
            if state is None:
                continue
            for guid in port_guids(port) & wanted:
                if states.get(guid) != "down":
                    states[guid] = state  # one down entry for a GUID is enough to call it down
        return states

    # -- HTTP ------------------------------------------------------------------------------------

    def _get(self, path: str, params: dict, *, missing_ok: bool = False):
        response = self._call("GET", path, params=params, what=f"read {path}", missing_ok=missing_ok)
        if response is None or not response.content:
            return None
        try:
            return response.json()
        except ValueError:
            raise DriverError(f"UFM {self.url} answered {path} with something that is not JSON; is the URL that "
                              "of a UFM server?", transient=True) from None

    def _call(self, method: str, path: str, *, what: str, missing_ok: bool = False, **kwargs):
        """
        One request. Network trouble, timeouts, throttling and 5xx are transient; other 4xx are
        for good. ``missing_ok``: a 404 means there is nothing to do (returns None).
        """
        try:
            response = self.session.request(method, self.url + path, timeout=self.timeout_s, **kwargs)
        except requests.Timeout:
            raise self._error(f"UFM {self.url} did not answer within {self.timeout_s:g}s to {what}.", True) from None
        except requests.RequestException as exc:
            raise self._error(f"Could not reach UFM {self.url} to {what}: {type(exc).__name__}: {exc}", True) \
                from None
        log.debug("UFM %s %s %s -> %s", self.url, method, path, response.status_code)
        if response.status_code == 404 and missing_ok:
            return None
        if response.status_code < 400:
            return response
        raise self._answer_error(response, what)

    def _answer_error(self, response: requests.Response, what: str) -> DriverError:
        status = response.status_code
        answer = self._answer_text(response)
        if status == 401:
            return self._error(f"UFM {self.url} refused the credentials of user '{self.username}' (HTTP 401) when "
                               f"asked to {what}; check the username and password set for this fabric in "
                               "MERIDIAN_FABRICS.", False)
        if status == 403:
            return self._error(f"UFM {self.url} does not let user '{self.username}' {what} (HTTP 403: {answer}); "
                               "give the user a UFM role that may do this (managing PKeys, reading ports).", False)
        if status >= 500 or status in RETRYABLE:
            return self._error(f"UFM {self.url} failed to {what} (HTTP {status}: {answer}); will retry.", True)
        return self._error(f"UFM {self.url} refused to {what} (HTTP {status}: {answer}); the request does not suit "
                           "this UFM -- check the partition and ports in UFM and its version.", False)

    @staticmethod
    def _answer_text(response: requests.Response) -> str:
        """What UFM said, short: its JSON ``error``/``message`` when there is one, else the text."""
        try:
            body = response.json()
        except ValueError:
            body = None
        if isinstance(body, dict):
            text = body.get("error") or body.get("message") or body.get("description") or str(body)
        else:
            text = response.text or response.reason or ""
        text = " ".join(str(text).split())
        return text[:300] or "no details"

    def _error(self, message: str, transient: bool) -> DriverError:
        """A DriverError whose message can never carry the password, whatever UFM echoed."""
        if self._password:
            message = message.replace(self._password, "***")
        return DriverError(message, transient=transient)
