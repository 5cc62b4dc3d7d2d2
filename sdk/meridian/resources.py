"""
The API's resources on the client (``client.reservations.list()``, ``client.vpcs.create(...)``),
declared once: each collection's standard operations and its actions. ``operations()`` lists what
the SDK calls, so a test holds it to the OpenAPI schema.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

# Reservation states a wait ends on whatever it waits for: they never move on.
FINAL_STATES = {"released", "cancelled", "failed", "expired", "rejected"}


class Collection:
    """A collection of the API (``path``): ``ops`` of list/get/create/update/delete, and actions."""

    def __init__(self, client, path: str, ops: str = "lg", actions: dict | None = None,
                 list_actions: dict | None = None, idempotent: bool = False):
        self.client, self.path, self.ops, self.idempotent = client, path, ops, idempotent
        self.actions, self.list_actions = actions or {}, list_actions or {}
        for name, (method, suffix) in self.actions.items():
            setattr(self, name, self._detail_action(method, suffix))
        for name, (method, suffix) in self.list_actions.items():
            setattr(self, name, self._list_action(method, suffix))

    def list(self, **filters) -> Iterator[dict]:
        """Every item (filters as the API's query parameters), page after page."""
        return self.client.pages(f"{self.path}/", {k: v for k, v in filters.items() if v is not None})

    def get(self, id) -> dict:
        return self.client.request("GET", f"{self.path}/{id}/")

    def create(self, **body) -> dict:
        """
        Create. Where the API honours an Idempotency-Key (reservations, VPCs, volumes, snapshots)
        one is sent, and a create whose answer was lost is sent again with it: it still makes one.
        """
        return self.client.request("POST", f"{self.path}/", json=body, idempotent_create=self.idempotent)

    def update(self, id, **changes) -> dict:
        return self.client.request("PATCH", f"{self.path}/{id}/", json=changes)

    def delete(self, id) -> None:
        return self.client.request("DELETE", f"{self.path}/{id}/")

    def _detail_action(self, method: str, suffix: str):
        def action(id, **body):
            return self.client.request(method, f"{self.path}/{id}/{suffix}/",
                                       json=body if method in ("POST", "PUT", "PATCH") else None,
                                       params=body if method == "GET" and body else None)
        action.__name__ = suffix.replace("-", "_")
        return action

    def _list_action(self, method: str, suffix: str):
        def action(**body):
            return self.client.request(method, f"{self.path}/{suffix}/",
                                       json=body if method == "POST" else None,
                                       params=body if method == "GET" and body else None)
        action.__name__ = suffix.replace("-", "_")
        return action

    def operations(self) -> set[tuple[str, str]]:
        done = {("GET", f"{self.path}/")} if "l" in self.ops else set()
        done |= {("GET", f"{self.path}/{{id}}/")} if "g" in self.ops else set()
        done |= {("POST", f"{self.path}/")} if "c" in self.ops else set()
        done |= {("PATCH", f"{self.path}/{{id}}/")} if "u" in self.ops else set()
        done |= {("DELETE", f"{self.path}/{{id}}/")} if "d" in self.ops else set()
        done |= {(method, f"{self.path}/{{id}}/{suffix}/") for method, suffix in self.actions.values()}
        done |= {(method, f"{self.path}/{suffix}/") for method, suffix in self.list_actions.values()}
        return done


class Waitable(Collection):
    """A collection whose objects move through states: ``wait_until`` polls one to a state."""

    def wait_until(self, id, state: str, *, timeout_s: float = 600.0, poll_s: float = 2.0, on_change=None) -> dict:
        """
        Poll until the object is in ``state`` (returned); TimeoutError after ``timeout_s``, or
        RuntimeError when it ends in a final state first. ``on_change(obj)`` sees every change.
        """
        deadline, last = time.monotonic() + timeout_s, None
        while True:
            current = self.get(id)
            if on_change is not None and current != last:
                on_change(current)
            last = current
            if current.get("state") == state:
                return current
            if current.get("state") in FINAL_STATES - {state}:
                raise RuntimeError(f"{self.path} {id} ended {current['state']}: {current.get('state_reason', '')}")
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{self.path} {id} is {current.get('state')} after {timeout_s:.0f} s, not {state}")
            time.sleep(poll_s)


POST, GET, PUT, DELETE = "POST", "GET", "PUT", "DELETE"


def attach(client) -> None:
    """Hang every collection on the client."""
    c = client
    c.me = lambda: c.request("GET", "me/")
    c.offerings = Collection(c, "offerings", "lgcu")
    c.regions = Collection(c, "regions", "lgcu")
    c.gpu_models = Collection(c, "gpu-models", "lgcu")
    c.reservations = Waitable(c, "reservations", "lgc", idempotent=True, actions={
        "cancel": (POST, "cancel"), "release": (POST, "release"), "extend": (POST, "extend"),
        "score": (GET, "score"), "usage": (GET, "usage"), "telemetry": (GET, "telemetry"),
        "receipts": (GET, "receipts"), "contact": (POST, "contact"), "hold": (POST, "hold"),
        "let_go": (POST, "let-go"), "operator_cancel": (POST, "operator-cancel"), "priority": (POST, "priority")})
    c.operations = Waitable(c, "operations")
    c.instances = Collection(c, "instances", actions={"console": (GET, "console")})
    c.vpcs = Waitable(c, "vpcs", "lgcd", idempotent=True, actions={"isolation_report": (GET, "isolation-report"),
                                                   "members": (GET, "members")})
    c.ssh_keys = Collection(c, "ssh-keys", "lgcd")
    c.images = Collection(c, "images", "lgcd", actions={"deprecate": (POST, "deprecate")})
    c.api_tokens = Collection(c, "api-tokens", "lgcd")
    c.teams = Collection(c, "teams", "lgcud")
    c.team_memberships = Collection(c, "team-memberships", "lgcud")
    c.memberships = Collection(c, "memberships", "lgud")
    c.invitations = Collection(c, "invitations", "lgcd", list_actions={"accept": (POST, "accept")})
    c.tenants = Collection(c, "tenants", "lgcu")
    c.quotas = Collection(c, "quotas", "lgcud")
    c.notifications = Collection(c, "notifications", actions={"read": (POST, "read")},
                                 list_actions={"read_all": (POST, "read-all")})
    c.high_priority = Collection(c, "high-priority-applications", "lgc", actions={
        "review": (POST, "review"), "withdraw": (POST, "withdraw")})
    c.volumes = Waitable(c, "volumes", "lgcd", idempotent=True, actions={
        "attach": (POST, "attach"), "detach": (POST, "detach"), "resize": (POST, "resize"),
        "credentials": (POST, "credentials"), "checkpoint_policy": (GET, "checkpoint-policy"),
        "set_checkpoint_policy": (PUT, "checkpoint-policy")})
    c.snapshots = Waitable(c, "snapshots", "lgcd", idempotent=True)
    c.checkpoints = Collection(c, "checkpoints", actions={"restore": (POST, "restore")})
    c.storage_classes = Collection(c, "storage-classes")
    c.prices = Collection(c, "prices", "lgc")
    c.spot_prices = Collection(c, "spot-prices")
    c.usage = Collection(c, "usage")
    c.invoices = Collection(c, "invoices", "lg", actions={"csv": (GET, "csv"), "credit_note": (POST, "credit-notes")},
                            list_actions={"current": (GET, "current")})
    c.budgets = Collection(c, "budgets", "lgcud")
    c.commitments = Collection(c, "commitments", "lgcd")
    c.credits = Collection(c, "credits", "lgc", list_actions={"balance": (GET, "balance")})
    c.webhooks = Collection(c, "webhooks", "lgcud", actions={"ping": (POST, "ping"),
                                                             "rotate_secret": (POST, "rotate-secret")},
                            list_actions={"event_types": (GET, "event-types")})
    c.webhook_deliveries = Collection(c, "webhook-deliveries", actions={"redeliver": (POST, "redeliver")})
    c.endpoints = Collection(c, "endpoints", "lgcud", actions={
        "replicas": (GET, "replicas"), "decisions": (GET, "decisions"), "utilization": (GET, "utilization")})
    c.sla = Collection(c, "sla")
    c.incidents = Collection(c, "incidents", actions={
        "acknowledge": (POST, "acknowledge"), "assign": (POST, "assign"), "resolve": (POST, "resolve")})
    c.audit_events = Collection(c, "audit-events")
    c.audit_chain = lambda: c.request("GET", "audit-chain/")
    # Staff: the fleet and its trust.
    c.nodes = Collection(c, "nodes", "lgc", actions={
        "maintenance": (POST, "maintenance"), "end_maintenance": (DELETE, "maintenance"),
        "steps": (GET, "steps"), "validate": (POST, "validate"), "validations": (GET, "validations")})
    c.gpus = Collection(c, "gpus", actions={"telemetry": (GET, "telemetry")})
    c.fabrics = Collection(c, "fabrics")
    c.attestation_reports = Collection(c, "attestation-reports")
    c.reference_measurements = Collection(c, "reference-measurements", "lgc")
    c.reference_manifests = Collection(c, "reference-manifests", "lgc")
    c.ocsp_statuses = Collection(c, "ocsp-statuses", "lgc")
    c.trust_anchors = Collection(c, "trust-anchors", "lgc")
    c.revocations = Collection(c, "revocations", "lgc")
    c.collections = [value for value in vars(c).values() if isinstance(value, Collection)]


def operations(client) -> set[tuple[str, str]]:
    """Every (method, path under /api/v1/) the SDK calls."""
    done = {("GET", "me/"), ("GET", "audit-chain/")}
    for collection in client.collections:
        done |= collection.operations()
    return done
