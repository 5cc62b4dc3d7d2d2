"""
Shared file systems on IBM Storage Scale (GPFS): each volume is an independent fileset of one
file system, with a fileset quota as its size and an NFS export (CES) limited to the tenant's
networks. Everything goes through Storage Scale's management REST API, version 2 (basic auth,
under ``/scalemgmt/v2``), as IBM's "IBM Storage Scale management API" reference documents it:

- ``GET  /filesystems/{fs}/filesets/{fileset}``: ``{"filesets": [{"filesetName", "config": {"path", ...}}]}``;
  a fileset that is not there is answered 404.
- ``GET  /filesystems/{fs}/filesets``: every fileset (``filesets``, paged by ``paging.next``).
- ``POST /filesystems/{fs}/filesets``: ``filesetName``, ``path`` (linked there at once),
  ``inodeSpace: "new"`` (an independent fileset: its own inodes, snapshots and quota), ``comment``.
- ``POST /filesystems/{fs}/quotas``: ``operationType: "setQuota"``, ``quotaType: "FILESET"``,
  ``objectName``, ``blockSoftLimit`` and ``blockHardLimit`` (``"2048G"``).
- ``GET|POST /filesystems/{fs}/filesets/{fileset}/snapshots[/{name}]`` (``snapshotName``) and
  ``DELETE .../snapshots/{name}``: fileset snapshots, seen in the fileset at ``.snapshots/<name>``.
- ``DELETE /filesystems/{fs}/filesets/{fileset}/link``: unlink it (``force``), before
- ``DELETE /filesystems/{fs}/filesets/{fileset}``: the fileset and what it holds.
- ``GET /nfs/exports/{path}``, ``POST /nfs/exports`` (``path``, ``nfsClients``: ``"CIDR(Access_Type=RW,
  Squash=root_squash)"`` each), ``PUT /nfs/exports/{path}`` (``nfsAdd`` / ``nfsRemove``) and
  ``DELETE /nfs/exports/{path}``; the path is URL-encoded in the URL.

Every change is asynchronous on the server: it answers 202 with ``jobs[0].jobId``, and
``GET /jobs/{jobId}`` tells ``RUNNING``, ``COMPLETED`` or ``FAILED`` (with ``result.stderr``). The
driver waits for each job (``MERIDIAN_STORAGE_SCALE_JOB_SECONDS``); one that does not finish in
time is a transient error, and the step asks again -- which finds the work done, since every call
is made idempotent by reading first.

Checkpoint data moves through the file system itself, mounted on the worker that moves it
(``MERIDIAN_STORAGE_SCALE_MOUNT``: where the file system's root is mounted there), see ``storage.data``.
"""

from __future__ import annotations

import logging
import time
from urllib.parse import quote

import requests
from django.conf import settings

from storage.data import MountedFiles
from storage.drivers.base import Export, StorageDriverError

log = logging.getLogger(__name__)

API = "/scalemgmt/v2"
PREFIX = "vol-"
# Answers worth retrying besides 5xx: timeout and throttling.
RETRYABLE = {408, 429}
ACCESS = "Access_Type=RW,Squash=root_squash"


class StorageScale(MountedFiles):
    """One Storage Scale file system behind its management API; every method is safe to repeat."""

    def __init__(self, *, url: str | None = None, username: str | None = None, password: str | None = None,
                 filesystem: str | None = None, verify_tls: bool | str | None = None, job_seconds: float | None = None,
                 mount: str | None = None, nfs_server: str | None = None):
        self.url = (url or settings.MERIDIAN_STORAGE_SCALE_URL).rstrip("/")
        self.filesystem = filesystem or settings.MERIDIAN_STORAGE_SCALE_FILESYSTEM
        self.job_seconds = job_seconds if job_seconds is not None else settings.MERIDIAN_STORAGE_SCALE_JOB_SECONDS
        self.nfs_server = nfs_server or settings.MERIDIAN_STORAGE_SCALE_NFS_SERVER
        self.session = requests.Session()
        self.session.auth = (username or settings.MERIDIAN_STORAGE_SCALE_USER,
                             password or settings.MERIDIAN_STORAGE_SCALE_PASSWORD)
        self.session.verify = settings.MERIDIAN_STORAGE_SCALE_VERIFY if verify_tls is None else verify_tls
        self.session.headers.update({"Accept": "application/json"})
        super().__init__(root=mount or settings.MERIDIAN_STORAGE_SCALE_MOUNT)

    def __repr__(self):
        return f"StorageScale({self.url}, {self.filesystem})"

    # -- the interface ---------------------------------------------------------------------------

    def create(self, *, ref: str, kind: str, size_gib: int, source: tuple[str, str] | None = None) -> None:
        if kind != "shared_fs":
            raise StorageDriverError(f"Storage Scale serves shared file systems, not {kind}: give the storage "
                                     "class another backend.", transient=False)
        if source is not None and self._snapshot(*source) is None:
            raise StorageDriverError(f"Storage Scale has no snapshot {source[1]} of {source[0]}.", transient=False)
        if self._fileset(ref) is None:
            self._change("POST", f"/filesystems/{self.filesystem}/filesets", f"create fileset {ref}", json={
                "filesetName": ref, "path": self.junction(ref), "inodeSpace": "new",
                "comment": "Meridian volume"})
        self._quota(ref, size_gib)
        if source is not None:  # the snapshot's files, read where the file system is mounted (copied again: same)
            self.copy_tree(from_ref=source[0], subdir=f".snapshots/{source[1]}", to_ref=ref)

    def snapshot(self, *, ref: str, snapshot: str) -> None:
        if self._snapshot(ref, snapshot) is None:
            self._change("POST", f"/filesystems/{self.filesystem}/filesets/{ref}/snapshots",
                         f"snapshot {ref}", json={"snapshotName": snapshot})

    def snapshot_delete(self, *, ref: str, snapshot: str) -> None:
        if self._snapshot(ref, snapshot) is not None:
            self._change("DELETE", f"/filesystems/{self.filesystem}/filesets/{ref}/snapshots/{snapshot}",
                         f"delete snapshot {snapshot}")

    def resize(self, *, ref: str, size_gib: int) -> None:
        if self._fileset(ref) is None:
            raise StorageDriverError(f"Storage Scale has no fileset {ref} to grow.", transient=False)
        self._quota(ref, size_gib)

    def delete(self, *, ref: str) -> None:
        path = self.junction(ref)
        if self._export(path) is not None:
            self._change("DELETE", f"/nfs/exports/{quote(path, safe='')}", f"remove the NFS export of {ref}")
        fileset = self._fileset(ref)
        if fileset is None:
            return
        left = self._call("GET", f"/filesystems/{self.filesystem}/filesets/{ref}/snapshots",
                          what=f"list the snapshots of {ref}", missing_ok=True)
        for snapshot in left.get("snapshots", []):  # Scale deletes no fileset that has snapshots
            self.snapshot_delete(ref=ref, snapshot=snapshot.get("snapshotName", ""))
        if fileset.get("config", {}).get("path"):
            self._change("DELETE", f"/filesystems/{self.filesystem}/filesets/{ref}/link", f"unlink {ref}",
                         json={"force": True})
        self._change("DELETE", f"/filesystems/{self.filesystem}/filesets/{ref}", f"delete fileset {ref}")

    def export(self, *, ref: str, clients: tuple[str, ...]) -> Export:
        if self._fileset(ref) is None:
            raise StorageDriverError(f"Storage Scale has no fileset {ref} to export.", transient=False)
        path = self.junction(ref)
        wanted = set(clients)
        current = self._export(path)
        if current is None:
            if wanted:
                self._change("POST", "/nfs/exports", f"export {ref}",
                             json={"path": path, "nfsClients": [f"{cidr}({ACCESS})" for cidr in sorted(wanted)]})
        else:
            held = {client.get("clientName") for client in current.get("nfsClients", []) if isinstance(client, dict)}
            for cidr in sorted(wanted - held):
                self._change("PUT", f"/nfs/exports/{quote(path, safe='')}", f"let {cidr} mount {ref}",
                             json={"nfsAdd": f"{cidr}({ACCESS})"})
            for cidr in sorted(held - wanted):
                self._change("PUT", f"/nfs/exports/{quote(path, safe='')}", f"stop {cidr} mounting {ref}",
                             json={"nfsRemove": cidr})
        return Export(target=f"{self.nfs_server}:{path}", clients=tuple(sorted(wanted)))

    def refs(self) -> set[str]:
        names, url = set(), f"/filesystems/{self.filesystem}/filesets"
        while url:
            body = self._call("GET", url, what="list filesets")
            names.update(f.get("filesetName", "") for f in body.get("filesets", []) if isinstance(f, dict))
            url = (body.get("paging") or {}).get("next", "")
            url = url.split(API, 1)[1] if API in url else url
        return {name for name in names if name.startswith(PREFIX)}

    def exports(self, *, refs: set[str]) -> dict[str, tuple[str, ...]]:
        """The clients the NFS exports of these filesets let in (one list of the exports, however many)."""
        body = self._call("GET", "/nfs/exports", what="list NFS exports")
        found = {}
        for export in body.get("exports", []):
            path = str(export.get("path", "")) if isinstance(export, dict) else ""
            ref = path.rstrip("/").rsplit("/", 1)[-1]
            if ref in refs:
                found[ref] = tuple(sorted(c.get("clientName", "") for c in export.get("nfsClients", [])
                                          if isinstance(c, dict)))
        return found

    def junction(self, ref: str) -> str:
        """Where the fileset is linked in the file system: ``/<fs>/<ref>`` (Scale mounts ``fs1`` at ``/gpfs/fs1``)."""
        return f"{settings.MERIDIAN_STORAGE_SCALE_PATH.rstrip('/')}/{ref}"

    # -- requests -------------------------------------------------------------------------------

    def _fileset(self, ref: str) -> dict | None:
        body = self._call("GET", f"/filesystems/{self.filesystem}/filesets/{ref}", what=f"read fileset {ref}",
                          missing_ok=True)
        filesets = body.get("filesets") if body else None
        return filesets[0] if filesets else None

    def _snapshot(self, ref: str, snapshot: str) -> dict | None:
        body = self._call("GET", f"/filesystems/{self.filesystem}/filesets/{ref}/snapshots/{snapshot}",
                          what=f"read snapshot {snapshot}", missing_ok=True)
        found = body.get("snapshots") if body else None
        return found[0] if found else None

    def _export(self, path: str) -> dict | None:
        body = self._call("GET", f"/nfs/exports/{quote(path, safe='')}", what=f"read the NFS export {path}",
                          missing_ok=True)
        exports = body.get("exports") if body else None
        return exports[0] if exports else None

    def _quota(self, ref: str, size_gib: int) -> None:
        self._change("POST", f"/filesystems/{self.filesystem}/quotas", f"set the quota of {ref}", json={
            "operationType": "setQuota", "quotaType": "FILESET", "objectName": ref,
            "blockSoftLimit": f"{size_gib}G", "blockHardLimit": f"{size_gib}G"})

    def _change(self, method: str, path: str, what: str, json: dict | None = None) -> None:
        """A change the server runs as a job: send it, then wait for its job to finish."""
        body = self._call(method, path, what=what, json=json)
        jobs = body.get("jobs") or []
        if jobs and isinstance(jobs[0], dict) and "jobId" in jobs[0]:
            self._wait(jobs[0]["jobId"], what)

    def _wait(self, job_id, what: str) -> None:
        deadline, delay = time.monotonic() + self.job_seconds, 0.05
        while True:
            body = self._call("GET", f"/jobs/{job_id}", what=f"follow job {job_id}")
            job = (body.get("jobs") or [{}])[0]
            status = str(job.get("status", "")).upper()
            if status == "COMPLETED":
                return
            if status == "FAILED":
                stderr = " ".join((job.get("result") or {}).get("stderr") or []) or "no reason given"
                raise StorageDriverError(f"Storage Scale could not {what}: {stderr}", transient=False)
            if time.monotonic() > deadline:
                raise StorageDriverError(f"Storage Scale's job {job_id} ({what}) is still {status or 'running'} "
                                         f"after {self.job_seconds:g} s; the step asks again.", transient=True)
            time.sleep(delay)
            delay = min(delay * 2, 1.0)

    def _call(self, method: str, path: str, *, what: str, json: dict | None = None, missing_ok: bool = False) -> dict:
        try:
            answer = self.session.request(method, self.url + API + path, json=json, timeout=10)
        except requests.RequestException as exc:
            raise StorageDriverError(f"Storage Scale at {self.url} did not answer ({what}): {exc}",
                                     transient=True) from exc
        if answer.status_code == 404 and missing_ok:
            return {}
        if answer.status_code >= 400:
            try:
                message = answer.json().get("status", {}).get("message", "")
            except ValueError:
                message = answer.text[:200]
            transient = answer.status_code >= 500 or answer.status_code in RETRYABLE
            hint = " Check MERIDIAN_STORAGE_SCALE_USER and _PASSWORD." if answer.status_code in (401, 403) else ""
            raise StorageDriverError(f"Storage Scale refused to {what} ({answer.status_code}): {message}.{hint}",
                                     transient=transient)
        try:
            return answer.json() if answer.content else {}
        except ValueError:
            raise StorageDriverError(f"Storage Scale answered {what} with something not JSON.",
                                     transient=True) from None
