"""
A local stand-in for NVIDIA UFM Enterprise's PKeys REST API, for the UFM fabric driver's tests.

What it accepts, answers and refuses follows the NVIDIA UFM Enterprise REST API Guide, section
"PKey GUIDs Rest API" (docs.nvidia.com/networking/display/UFMEnterpriseRESTAPILatest/PKey+GUIDs+Rest+API,
same text in v6.11-v6.24), and, where the guide shows no example, what NVIDIA's own UFM client
and mock in NVIDIA/bare-metal-manager (crates/ufm-mock, ib/ufmclient) and Mellanox/ib-kubernetes
(pkg/sm/plugins/ufm) expect of a real UFM:

- HTTP basic auth on every call under ``/ufmRest``; a wrong one is answered 401.
- P_Keys are hex strings (``"0x12"``) "between 0x0-0x7fff exclusive" for every write; 0x7fff is
  the management key, read-only (UFM Enterprise User Manual, "PKeys Window").
- GUIDs are "hexadecimal string[s] with a minimum length of 16 characters and maximum length of
  20 characters"; UFM answers them as 16 lower-case hex digits.
- ``membership`` is ``full`` or ``limited``; ``memberships`` must be as long as ``guids`` and
  cannot come with ``membership``.
- A P_Key that is not there: ``GET`` of it answers 200 ``{}``; ``DELETE``, removing GUIDs from it
  and ``qos_conf`` answer 404.
- Removing a P_Key's last GUID deletes the P_Key (real UFM does; NVIDIA nv-config-manager PR 72).

It also answers ``GET /ufmRest/resources/ports`` (the guide's "Ports REST API", "Get All Ports"):
the list in ``fabric.ports``, each port a dict with UFM's fields (``guid``, ``name``,
``logical_state``, ``physical_state``, ...) as a test puts them.

Errors come back as ``{"error": "..."}`` with the status, as NVIDIA's mock answers them.
``fail_next`` and ``delay_s`` let a test make the server answer 5xx or slowly; ``requests``
records every request seen, so a test can prove none was sent.
"""

from __future__ import annotations

import base64
import json
import re
import threading
import time
from http.server import ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from tests.fake_http import VerbHandler

DEFAULT_PKEY = 0x7FFF
MEMBERSHIPS = ("full", "limited")
# Rates the guide's add-PKey call takes (rate_limit, Gb/s) and MTU codes (mtu_limit, 1-5 = 256-4096).
RATES = (2.5, 10, 30, 5, 20, 40, 60, 80, 120, 14, 56, 112, 168, 25, 100, 200, 300)
MTU_CODES = range(1, 6)
# What UFM gives a P_Key created without them (the guide's example; NVIDIA's mock defaults).
DEFAULT_QOS = {"mtu_limit": 2, "service_level": 0, "rate_limit": 2.5}
_GUID = re.compile(r"^(0x)?[0-9a-fA-F]+$")
_PKEY = re.compile(r"^0x[0-9a-fA-F]{1,4}$")


class UFMError(Exception):
    """An answer other than 200: its status and what UFM says."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def parse_pkey(value, *, writable: bool = True) -> int:
    """A P_Key from its hex string; 400 when malformed, or out of range for a write."""
    if not isinstance(value, str) or not _PKEY.match(value.strip()):
        raise UFMError(400, f"Invalid pkey {value!r}: a hexadecimal string like \"0x12\" is required")
    pkey = int(value, 16)
    if writable and not 0x0 < pkey < DEFAULT_PKEY:
        raise UFMError(400, f"Invalid pkey {value}: must be between 0x0-0x7fff exclusive")
    return pkey


def parse_guid(value) -> str:
    """A GUID as UFM stores it (16 lower-case hex digits); 400 when not 16-20 hex characters."""
    if not isinstance(value, str) or not 16 <= len(value) <= 20 or not _GUID.match(value):
        raise UFMError(400, f"Invalid GUID {value!r}: a hexadecimal string of 16-20 characters is required")
    digits = value.lower().removeprefix("0x")
    if len(digits) > 16:
        raise UFMError(400, f"Invalid GUID {value!r}: more than 64 bits")
    return digits.rjust(16, "0")


def parse_guids(value) -> list[str]:
    if not isinstance(value, list) or not value:
        raise UFMError(400, "guids is mandatory: a non-empty list of port GUIDs")
    return [parse_guid(guid) for guid in value]


def parse_bool(body: dict, name: str, default: bool) -> bool:
    value = body.get(name, default)
    if not isinstance(value, bool):
        raise UFMError(400, f"Invalid {name} {value!r}: true or false is required")
    return value


def parse_qos(body: dict, base: dict) -> dict:
    """``mtu_limit``, ``service_level`` and ``rate_limit`` from a body, the rest from ``base``."""
    qos = {**base, **{k: body[k] for k in DEFAULT_QOS if k in body}}
    if isinstance(qos["mtu_limit"], bool) or qos["mtu_limit"] not in MTU_CODES:
        raise UFMError(400, f"Invalid mtu_limit {qos['mtu_limit']!r}: an MTU code 1-5 is required")
    if isinstance(qos["service_level"], bool) or qos["service_level"] not in range(16):
        raise UFMError(400, f"Invalid service_level {qos['service_level']!r}: 0-15 is required")
    if isinstance(qos["rate_limit"], bool) or qos["rate_limit"] not in RATES:
        raise UFMError(400, f"Invalid rate_limit {qos['rate_limit']!r}: one of {', '.join(map(str, RATES))}")
    return qos


def parse_memberships(body: dict, count: int) -> list[str]:
    """One membership per GUID from ``membership`` (default full) or ``memberships``, never both."""
    if "memberships" in body and "membership" in body:
        raise UFMError(400, "membership and memberships conflict: send one of them")
    if "memberships" in body:
        wanted = body["memberships"]
        if not isinstance(wanted, list) or len(wanted) != count:
            raise UFMError(400, "memberships must be a list as long as guids")
    else:
        wanted = [body.get("membership", "full")] * count
    for membership in wanted:
        if membership not in MEMBERSHIPS:
            raise UFMError(400, f"Invalid membership {membership!r}: \"full\" or \"limited\" is required")
    return wanted


class Fabric:
    """UFM's P_Keys in memory: pkey -> name, ip_over_ib, qos and members (guid -> membership, index0)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.default_membership = "limited"
        self.pkeys = {DEFAULT_PKEY: {"partition": "management", "ip_over_ib": True, "qos": dict(DEFAULT_QOS),
                                     "members": {}}}
        self.ports: list[dict] = []

    def view(self, pkey: int, guids: bool, qos: bool) -> dict:
        """One P_Key as UFM answers it; 0x7fff also tells the membership UFM gives every port (6.19+)."""
        entry = self.pkeys[pkey]
        data = {"partition": entry["partition"], "ip_over_ib": entry["ip_over_ib"]}
        if guids:
            data["guids"] = [{"guid": guid, "membership": m, "index0": index0}
                             for guid, (m, index0) in sorted(entry["members"].items())]
            if pkey == DEFAULT_PKEY:
                data["membership"] = self.default_membership
        if qos:
            data["qos_conf"] = dict(entry["qos"])
        return data

    def add_pkey(self, body: dict) -> None:
        pkey = parse_pkey(body.get("pkey"))
        qos = parse_qos(body, DEFAULT_QOS)
        ipoib = parse_bool(body, "ip_over_ib", True)
        parse_bool(body, "index0", False)
        name = body.get("partition_name") or f"api_pkey_{pkey:#x}"
        if pkey in self.pkeys:
            raise UFMError(400, f"PKey {pkey:#x} already exists")
        self.pkeys[pkey] = {"partition": str(name), "ip_over_ib": ipoib, "qos": qos, "members": {}}

    def add_guids(self, body: dict) -> None:
        pkey = parse_pkey(body.get("pkey"))
        guids = parse_guids(body.get("guids"))
        memberships = parse_memberships(body, len(guids))
        ipoib = parse_bool(body, "ip_over_ib", True)
        index0 = parse_bool(body, "index0", False)
        entry = self.pkeys.setdefault(pkey, {"partition": f"api_pkey_{pkey:#x}", "qos": dict(DEFAULT_QOS),
                                             "members": {}})
        entry["ip_over_ib"] = ipoib
        for guid, membership in zip(guids, memberships, strict=True):
            entry["members"][guid] = (membership, index0)

    def remove_guids(self, pkey: int, guids: list[str]) -> None:
        if pkey not in self.pkeys:
            raise UFMError(404, f"PKey {pkey:#x} does not exist")
        members = self.pkeys[pkey]["members"]
        for guid in guids:
            members.pop(guid, None)
        if not members:
            del self.pkeys[pkey]

    def set_qos(self, body: dict) -> None:
        pkey = parse_pkey(body.get("pkey"))
        if pkey not in self.pkeys:
            raise UFMError(404, f"PKey {pkey:#x} does not exist")
        self.pkeys[pkey]["qos"] = parse_qos(body, self.pkeys[pkey]["qos"])

    def delete(self, pkey: int) -> None:
        if pkey not in self.pkeys:
            raise UFMError(404, f"PKey {pkey:#x} does not exist")
        del self.pkeys[pkey]


class Handler(VerbHandler):
    """Routes ``/ufmRest`` requests to the fabric, after basic auth and any injected fault."""

    server: UFMServer

    def _serve(self, method: str) -> None:
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        body = self._body()
        self.server.requests.append((method, url.path, query, body))
        if self.server.delay_s:
            time.sleep(self.server.delay_s)
        try:
            self._check_auth()
            self.server.take_fault()
            with self.server.fabric.lock:
                answer = self._route(method, url.path.rstrip("/"), query, body)
        except UFMError as exc:
            self._send(exc.status, {"error": str(exc)})
            return
        self._send(200, answer)

    def _route(self, method: str, path: str, query: dict, body):
        fabric = self.server.fabric
        guids_data, qos_conf = query.get("guids_data") == "true", query.get("qos_conf") == "true"
        parts = path.split("/")[1:]
        if method == "GET" and path == "/ufmRest/resources/ports":
            # ?sys_type=Computer|Switch: the ports of that kind of system (UFM's descriptions say which).
            kind = query.get("sys_type")
            return [port for port in fabric.ports if not kind or not isinstance(port, dict)
                    or str(port.get("description", "")).startswith(kind)]
        if parts[:3] != ["ufmRest", "resources", "pkeys"]:
            if method == "POST" and path == "/ufmRest/actions/remove_guids_from_pkey":
                return self._remove_action(body)
            raise UFMError(404, f"No such resource {path}")
        rest = parts[3:]
        if not isinstance(body, dict) and method in ("POST", "PUT"):
            raise UFMError(400, "A JSON object body is required")
        return self._pkeys(method, rest, guids_data, qos_conf, body, fabric)

    def _pkeys(self, method, rest, guids_data, qos_conf, body, fabric):
        # "Get all PKeys": without a flag, only the P_Key names (the structure differs, as NVIDIA's
        # client notes); with guids_data and/or qos_conf, an object keyed by P_Key.
        if method == "GET" and not rest:
            if not (guids_data or qos_conf):
                return [f"{pkey:#x}" for pkey in sorted(fabric.pkeys)]
            return {f"{pkey:#x}": fabric.view(pkey, guids_data, qos_conf) for pkey in sorted(fabric.pkeys)}
        # "Get a Specific PKey": 200 and {} when there is none.
        if method == "GET" and len(rest) == 1:
            pkey = parse_pkey(rest[0], writable=False)
            return fabric.view(pkey, guids_data, qos_conf) if pkey in fabric.pkeys else {}
        # Create an empty PKey: POST /ufmRest/resources/pkeys/add.
        if method == "POST" and rest == ["add"]:
            return fabric.add_pkey(body) or {}
        # "Add GUIDs to PKey": POST /ufmRest/resources/pkeys.
        if method == "POST" and not rest:
            return fabric.add_guids(body) or {}
        # "Update QoS for PKey": PUT /ufmRest/resources/pkeys/qos_conf.
        if method == "PUT" and rest == ["qos_conf"]:
            return fabric.set_qos(body) or {}
        # "Delete PKey": DELETE /ufmRest/resources/pkeys/<pkey>.
        if method == "DELETE" and len(rest) == 1:
            return fabric.delete(parse_pkey(rest[0])) or {}
        # "Remove GUIDs from PKey": DELETE /ufmRest/resources/pkeys/<pkey>/guids/<guid>,<guid>.
        if method == "DELETE" and len(rest) == 3 and rest[1] == "guids":
            guids = [parse_guid(guid) for guid in rest[2].split(",") if guid]
            return fabric.remove_guids(parse_pkey(rest[0]), guids) or {}
        raise UFMError(404 if method == "GET" else 405, f"{method} is not supported on this resource")

    def _remove_action(self, body) -> dict:
        """The deprecated POST /ufmRest/actions/remove_guids_from_pkey: {"pkey", "guids"}."""
        if not isinstance(body, dict):
            raise UFMError(400, "A JSON object body is required")
        pkey = parse_pkey(body.get("pkey"))
        self.server.fabric.remove_guids(pkey, parse_guids(body.get("guids")))
        return {}

    def _body(self):
        length = int(self.headers.get("Content-Length") or 0)
        if not length:
            return None
        raw = self.rfile.read(length)
        try:
            return json.loads(raw)
        except ValueError:
            return raw.decode(errors="replace")

    def _check_auth(self) -> None:
        expected = base64.b64encode(f"{self.server.username}:{self.server.password}".encode()).decode()
        if self.headers.get("Authorization") != f"Basic {expected}":
            raise UFMError(401, "Unauthorized")

    def _send(self, status: int, answer) -> None:
        data = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class UFMServer(ThreadingHTTPServer):
    """The server on 127.0.0.1 and a free port; ``url`` is what UFMFabric is given."""

    daemon_threads = True

    def __init__(self, *, username: str, password: str):
        super().__init__(("127.0.0.1", 0), Handler)
        self.username, self.password = username, password
        self.fabric = Fabric()
        self.requests: list[tuple] = []
        self.faults: list[int] = []
        self.delay_s = 0.0
        self.thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def writes(self) -> list[tuple]:
        """The requests that would change UFM (all but GET)."""
        return [r for r in self.requests if r[0] != "GET"]

    def fail_next(self, *statuses: int) -> None:
        """Answer the next requests with these statuses (after auth), one each."""
        self.faults.extend(statuses)

    def take_fault(self) -> None:
        if self.faults:
            status = self.faults.pop(0)
            raise UFMError(status, "Internal server error" if status >= 500 else "Injected fault")

    def start(self) -> UFMServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
        self.thread.join(timeout=5)
