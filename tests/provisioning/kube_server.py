"""
A local stand-in for the part of the Kubernetes API the container driver uses, so the driver's
tests exercise the official ``kubernetes`` client end to end over HTTP (a real kube-apiserver
needs etcd and cannot run here).

What it accepts and answers follows the Kubernetes API reference (v1.33): namespaces, secrets
and pods under ``/api/v1``, network policies under ``/apis/networking.k8s.io/v1``; POST creates
(201, or 409 ``AlreadyExists``), GET reads (404 ``NotFound``), PUT replaces, DELETE removes and
answers the object. Errors come back as ``Status`` objects with ``reason`` and ``code``, as the
API server writes them; a bearer token is required (401 otherwise); a namespaced object needs
its namespace (404) and the same namespace in its body (400); names are DNS-1123 (422
``Invalid``), a pod's containers need an image (422). Secrets' ``stringData`` is merged into
``data`` (base64), as the API server does.

A pod is created ``Pending``; ``start(ns, name)`` runs it, ``wait(ns, name, reason)`` leaves
its container waiting (``ImagePullBackOff``...), or ``auto_start`` runs every pod at once.
``fail_next`` answers the next requests with the given statuses; ``requests`` records them all.
"""

from __future__ import annotations

import base64
import json
import re
import threading
import uuid
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

CORE = re.compile(r"^/api/v1/namespaces(?:/(?P<ns>[^/]+)(?:/(?P<kind>secrets|pods)(?:/(?P<name>[^/]+))?)?)?$")
NETWORKING = re.compile(r"^/apis/networking\.k8s\.io/v1/namespaces/(?P<ns>[^/]+)/(?P<kind>networkpolicies)"
                        r"(?:/(?P<name>[^/]+))?$")
DNS_1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
KINDS = {"namespaces": "Namespace", "secrets": "Secret", "pods": "Pod", "networkpolicies": "NetworkPolicy"}


def status(code: int, reason: str, message: str) -> dict:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}


class KubeAPI:
    def __init__(self, *, token: str = "sa-token", auto_start: bool = False):  # noqa: S107 -- a test token
        self.token = token
        self.auto_start = auto_start
        self.objects: dict[tuple[str, str, str], dict] = {}  # (kind, namespace, name) -> object
        self.requests: list[tuple[str, str, dict | None]] = []
        self.fail_next: list[int] = []
        self.lock = threading.Lock()

    # What a test does to the cluster.

    def start(self, namespace: str, name: str) -> None:
        with self.lock:
            self.objects[("pods", namespace, name)]["status"] = {"phase": "Running"}

    def wait(self, namespace: str, name: str, reason: str, message: str = "") -> None:
        with self.lock:
            self.objects[("pods", namespace, name)]["status"] = {"phase": "Pending", "containerStatuses": [
                {"name": "main", "ready": False, "state": {"waiting": {"reason": reason, "message": message}}}]}

    def get(self, kind: str, namespace: str, name: str) -> dict | None:
        return self.objects.get((kind, namespace, name))

    def names(self, kind: str) -> list[str]:
        return sorted(f"{ns}/{name}" if ns else name for k, ns, name in self.objects if k == kind)

    # The API.

    def handle(self, method: str, path: str, headers, body: dict | None) -> tuple[int, dict]:
        with self.lock:
            self.requests.append((method, path, body))
            if self.fail_next:
                code = self.fail_next.pop(0)
                return code, status(code, "InternalError" if code >= 500 else "TooManyRequests",
                                    "the server is currently unable to handle the request")
            if headers.get("Authorization") != f"Bearer {self.token}":
                return 401, status(401, "Unauthorized", "Unauthorized")
            match = CORE.match(path) or NETWORKING.match(path)
            if match is None:
                return 404, status(404, "NotFound", "the server could not find the requested resource")
            ns, kind, name = match.group("ns"), match.groupdict().get("kind"), match.group("name")
            if kind is None:  # /api/v1/namespaces[/<ns>]
                kind, name, ns = "namespaces", ns, ""
            elif ("namespaces", "", ns) not in self.objects and method == "POST":
                return 404, status(404, "NotFound", f'namespaces "{ns}" not found')
            return self._on(method, kind, ns, name, body)

    def _on(self, method, kind, ns, name, body) -> tuple[int, dict]:
        key = (kind, ns, name)
        if method == "GET":
            if key not in self.objects:
                return 404, status(404, "NotFound", f'{kind} "{name}" not found')
            return 200, self.objects[key]
        if method == "DELETE":
            gone = self.objects.pop(key, None)
            if gone is None:
                return 404, status(404, "NotFound", f'{kind} "{name}" not found')
            return 200, gone
        if method not in ("POST", "PUT") or body is None:
            return 405, status(405, "MethodNotAllowed", f"{method} is not supported here")
        problem = self._invalid(kind, ns, body)
        if problem:
            return problem
        name = body["metadata"]["name"] if method == "POST" else name
        key = (kind, ns, name)
        if method == "POST" and key in self.objects:
            return 409, status(409, "AlreadyExists", f'{kind} "{name}" already exists')
        if method == "PUT" and key not in self.objects:
            return 404, status(404, "NotFound", f'{kind} "{name}" not found')
        stored = self._stored(kind, body, self.objects.get(key))
        self.objects[key] = stored
        return (201 if method == "POST" else 200), stored

    def _invalid(self, kind, ns, body):
        if body.get("kind") != KINDS[kind]:
            return 400, status(400, "BadRequest", f"expected kind {KINDS[kind]}, got {body.get('kind')}")
        meta = body.get("metadata") or {}
        if ns and meta.get("namespace") not in (None, ns):
            return 400, status(400, "BadRequest", "the namespace of the provided object does not match the "
                                                  "namespace sent on the request")
        name = meta.get("name") or ""
        if not DNS_1123.match(name) or len(name) > 253:
            return 422, status(422, "Invalid", f'{KINDS[kind]} "{name}" is invalid: metadata.name: Invalid value')
        if kind == "pods":
            containers = (body.get("spec") or {}).get("containers") or []
            if not containers or any(not c.get("image") for c in containers):
                return 422, status(422, "Invalid", f'Pod "{name}" is invalid: spec.containers[0].image: Required '
                                                   "value")
        return None

    def _stored(self, kind, body, before) -> dict:
        stored = json.loads(json.dumps(body))
        meta = stored.setdefault("metadata", {})
        meta["uid"] = (before or {}).get("metadata", {}).get("uid") or str(uuid.uuid4())
        meta["resourceVersion"] = str(len(self.requests))
        meta["creationTimestamp"] = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        if kind == "secrets":
            data = stored.setdefault("data", {})
            for key, value in (stored.pop("stringData", None) or {}).items():
                data[key] = base64.b64encode(value.encode()).decode()
        if kind == "pods":
            stored["status"] = {"phase": "Running" if self.auto_start else "Pending"}
        return stored


def serve(api: KubeAPI) -> tuple[ThreadingHTTPServer, str]:
    """Serve ``api`` on a free local port; the caller shuts the server down."""

    class Handler(BaseHTTPRequestHandler):
        def _answer(self):
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                code, answer = 400, status(400, "BadRequest", "the body is not JSON")
            else:
                code, answer = api.handle(self.command, urlsplit(self.path).path, self.headers, body)
            data = json.dumps(answer).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PUT = do_DELETE = _answer

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"
