"""
A local stand-in for IBM Storage Scale's management REST API (v2), for the Storage Scale driver's
tests. What it accepts, answers and refuses follows IBM's "IBM Storage Scale management API"
endpoint reference (filesets, quotas, NFS exports, jobs):

- HTTP basic auth on every call under ``/scalemgmt/v2``; a wrong one is answered 401.
- Changes answer 202 with ``{"jobs": [{"jobId": n, "status": "RUNNING"}], "status": {"code": 202}}``;
  ``GET /jobs/{n}`` answers ``RUNNING`` for ``job_polls`` reads, then ``COMPLETED`` (or ``FAILED``
  with ``result.stderr`` when a test set ``fail_job``). A change takes effect when its job completes.
- A fileset that is not there: 404 on GET and DELETE. A fileset name taken: the job fails
  (``mmcrfileset``: "Fileset ... already exists"). A linked fileset is not deleted (``mmdelfileset``
  refuses it) until ``DELETE .../link`` unlinks it.
- Fileset snapshots: ``POST .../filesets/{fileset}/snapshots`` (``snapshotName``), ``GET`` and
  ``DELETE .../snapshots/{name}`` (404 when there is none); with ``root``, a snapshot is a copy of
  the fileset's files at ``<root>/<fileset>/.snapshots/<name>``, as Scale shows it.
- An NFS export of a path that has none, or of a path that is not linked: 400 on POST; 404 on GET,
  PUT and DELETE of a path with no export.

When ``root`` is given, a linked fileset is a directory ``<root>/<name>`` (the file system as a
node that mounts it sees it), removed with the fileset. ``fail_next`` makes the next calls answer
503; ``requests`` records every request seen.
"""

from __future__ import annotations

import base64
import json
import shutil
import threading
from http.server import ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

from tests.fake_http import VerbHandler

API = "/scalemgmt/v2"


class ScaleError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class Cluster:
    """One file system's filesets, fileset quotas and NFS exports, and the jobs that change them."""

    def __init__(self, filesystem: str, root: Path | None):
        self.lock = threading.Lock()
        self.filesystem = filesystem
        self.root = root
        self.filesets: dict[str, dict] = {}
        self.quotas: dict[str, str] = {}
        self.exports: dict[str, list[str]] = {}  # path -> client specs ("10.0.0.0/24(Access_Type=RW,...)")
        self.jobs: dict[int, dict] = {}
        self.job_polls = 1
        self.fail_job: str | None = None

    def job(self, change) -> dict:
        job_id = len(self.jobs) + 1000
        self.jobs[job_id] = {"change": change, "polls": 0, "status": "RUNNING"}
        return {"jobs": [{"jobId": job_id, "status": "RUNNING"}],
                "status": {"code": 202, "message": "The request was accepted for processing."}}

    def poll(self, job_id: int) -> dict:
        job = self.jobs.get(job_id)
        if job is None:
            raise ScaleError(404, f"Job {job_id} not found")
        if job["status"] == "RUNNING":
            job["polls"] += 1
            if job["polls"] > self.job_polls:
                try:
                    if self.fail_job:
                        raise ScaleError(400, self.fail_job)
                    job["change"]()
                    job["status"], job["stderr"] = "COMPLETED", []
                except ScaleError as exc:
                    job["status"], job["stderr"] = "FAILED", [f"EFSSG0000C {exc}"]
                finally:
                    self.fail_job = None
        return {"jobs": [{"jobId": job_id, "status": job["status"],
                          "result": {"stderr": job.get("stderr", []), "exitCode": 0 if job["status"] != "FAILED"
                                     else 1}}], "status": {"code": 200}}

    # -- the changes a job makes ------------------------------------------------------------------

    def create_fileset(self, name: str, path: str) -> None:
        if name in self.filesets:
            raise ScaleError(400, f"Fileset {name} already exists.")
        self.filesets[name] = {"filesetName": name, "filesystemName": self.filesystem,
                               "config": {"path": path, "inodeSpace": len(self.filesets) + 1}}
        if self.root is not None:
            (self.root / name).mkdir(parents=True, exist_ok=True)

    def snapshot(self, name: str, snapshot: str) -> None:
        taken = self.filesets[name].setdefault("snapshots", {})
        if snapshot in taken:
            raise ScaleError(400, f"Snapshot {snapshot} already exists.")
        taken[snapshot] = {"snapshotName": snapshot, "filesetName": name, "status": "Valid"}
        if self.root is not None:
            shutil.copytree(self.root / name, self.root / name / ".snapshots" / snapshot,
                            ignore=shutil.ignore_patterns(".snapshots"))

    def snapshot_delete(self, name: str, snapshot: str) -> None:
        self.filesets[name].get("snapshots", {}).pop(snapshot, None)
        if self.root is not None:
            shutil.rmtree(self.root / name / ".snapshots" / snapshot, ignore_errors=True)

    def unlink(self, name: str) -> None:
        self.filesets[name]["config"]["path"] = ""

    def delete_fileset(self, name: str) -> None:
        if name not in self.filesets:
            raise ScaleError(400, f"Fileset {name} not found.")
        if self.filesets[name]["config"]["path"]:
            raise ScaleError(400, f"Fileset {name} is linked: unlink it first.")
        if self.filesets[name].get("snapshots"):
            raise ScaleError(400, f"Fileset {name} has snapshots: delete them first.")
        del self.filesets[name]
        self.quotas.pop(name, None)
        if self.root is not None:
            shutil.rmtree(self.root / name, ignore_errors=True)


def make_handler(cluster: Cluster, credentials: tuple[str, str], state: dict):
    expected = "Basic " + base64.b64encode(":".join(credentials).encode()).decode()

    class Handler(VerbHandler):
        def _serve(self, method: str):
            url = urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            state["requests"].append((method, url.path, raw))
            try:
                if state["fail_next"] > 0:
                    state["fail_next"] -= 1
                    raise ScaleError(503, "Service unavailable")
                if self.headers.get("Authorization") != expected:
                    raise ScaleError(401, "Unauthorized")
                if not url.path.startswith(API + "/"):
                    raise ScaleError(404, f"No endpoint {url.path}")
                body = json.loads(raw) if raw else {}
                with cluster.lock:
                    status, answer = route(cluster, method, url.path[len(API):], body)
            except ScaleError as exc:
                status, answer = exc.status, {"status": {"code": exc.status, "message": str(exc)}}
            except (ValueError, KeyError, TypeError) as exc:
                status, answer = 400, {"status": {"code": 400, "message": f"Invalid request: {exc}"}}
            data = json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Handler


def route(cluster: Cluster, method: str, path: str, body: dict) -> tuple[int, dict]:
    parts = [unquote(p) for p in path.strip("/").split("/")]
    fs = cluster.filesystem
    if parts[:1] == ["jobs"] and len(parts) == 2 and method == "GET":
        return 200, cluster.poll(int(parts[1]))
    if parts[:2] == ["filesystems", fs] and parts[2:3] == ["filesets"]:
        return fileset_route(cluster, method, parts[3:], body)
    if parts[:2] == ["filesystems", fs] and parts[2:] == ["quotas"] and method == "POST":
        if body.get("operationType") != "setQuota" or str(body.get("quotaType", "")).upper() != "FILESET":
            raise ScaleError(400, "operationType setQuota and quotaType FILESET are required")
        name, limit = body["objectName"], str(body["blockHardLimit"])
        if name not in cluster.filesets:
            raise ScaleError(400, f"Fileset {name} not found.")
        return 202, cluster.job(lambda: cluster.quotas.__setitem__(name, limit))
    if parts[:2] == ["nfs", "exports"]:
        return export_route(cluster, method, "/".join(parts[2:]), body)
    if parts[:1] == ["filesystems"]:
        raise ScaleError(400, f"Invalid value in 'filesystemName': {parts[1] if len(parts) > 1 else ''}")
    raise ScaleError(404, f"No endpoint {path}")


def fileset_route(cluster: Cluster, method: str, rest: list[str], body: dict) -> tuple[int, dict]:
    if not rest:
        if method == "GET":
            return 200, {"filesets": [dict(f) for f in cluster.filesets.values()], "status": {"code": 200}}
        if method == "POST":
            name, path = body["filesetName"], body.get("path", "")
            if body.get("inodeSpace") != "new":
                raise ScaleError(400, "Only independent filesets (inodeSpace new) are expected here")
            return 202, cluster.job(lambda: cluster.create_fileset(name, path))
    name = rest[0]
    if name not in cluster.filesets:
        raise ScaleError(404, f"Fileset {name} not found")
    if rest[1:2] == ["snapshots"]:
        taken = cluster.filesets[name].get("snapshots", {})
        if len(rest) == 2 and method == "GET":
            return 200, {"snapshots": [dict(t) for t in taken.values()], "status": {"code": 200}}
        if len(rest) == 2 and method == "POST":
            snapshot = body["snapshotName"]
            return 202, cluster.job(lambda: cluster.snapshot(name, snapshot))
        if len(rest) == 3 and rest[2] not in taken:
            raise ScaleError(404, f"Snapshot {rest[2]} not found")
        if len(rest) == 3 and method == "GET":
            return 200, {"snapshots": [dict(taken[rest[2]])], "status": {"code": 200}}
        if len(rest) == 3 and method == "DELETE":
            return 202, cluster.job(lambda: cluster.snapshot_delete(name, rest[2]))
    if rest[1:] == ["link"] and method == "DELETE":
        return 202, cluster.job(lambda: cluster.unlink(name))
    if len(rest) == 1 and method == "GET":
        fileset = {k: v for k, v in cluster.filesets[name].items() if k != "snapshots"}
        fileset["config"] = dict(fileset["config"])
        return 200, {"filesets": [fileset], "status": {"code": 200}}
    if len(rest) == 1 and method == "DELETE":
        return 202, cluster.job(lambda: cluster.delete_fileset(name))
    raise ScaleError(404, f"No endpoint for {method} filesets/{'/'.join(rest)}")


def export_route(cluster: Cluster, method: str, path: str, body: dict) -> tuple[int, dict]:
    if not path:
        if method == "GET":
            return 200, {"exports": [_export_view(p, c) for p, c in cluster.exports.items()], "status": {"code": 200}}
        if method == "POST":
            target, clients = body["path"], list(body["nfsClients"])
            if target in cluster.exports:
                raise ScaleError(400, f"An export of {target} exists already")
            if not any(f["config"]["path"] == target for f in cluster.filesets.values()):
                raise ScaleError(400, f"{target} is not a linked fileset's path")
            return 202, cluster.job(lambda: cluster.exports.__setitem__(target, clients))
    path = "/" + path.lstrip("/")
    if path not in cluster.exports:
        raise ScaleError(404, f"No NFS export of {path}")
    if method == "GET":
        return 200, {"exports": [_export_view(path, cluster.exports[path])], "status": {"code": 200}}
    if method == "DELETE":
        return 202, cluster.job(lambda: cluster.exports.pop(path, None))
    if method == "PUT":
        def change():
            clients = cluster.exports[path]
            if body.get("nfsAdd"):
                clients.append(body["nfsAdd"])
            if body.get("nfsRemove"):
                cluster.exports[path] = [c for c in clients if c.split("(")[0] != body["nfsRemove"]]
        return 202, cluster.job(change)
    raise ScaleError(404, f"No endpoint for {method} nfs/exports")


def _export_view(path: str, clients: list[str]) -> dict:
    return {"path": path, "nfsClients": [{"clientName": c.split("(")[0], "access_type": "RW"} for c in clients]}


class ScaleServer:
    """``with ScaleServer() as scale:`` -- the management API on a free local port."""

    def __init__(self, *, filesystem: str = "fs1", root: Path | None = None, username: str = "admin",
                 password: str = "admin001"):  # noqa: S107 -- a test server
        self.cluster = Cluster(filesystem, root)
        self.credentials = (username, password)
        self.state = {"requests": [], "fail_next": 0}
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(self.cluster, self.credentials, self.state))
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    @property
    def requests(self) -> list:
        return self.state["requests"]

    def fail_next(self, count: int = 1) -> None:
        self.state["fail_next"] = count

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
