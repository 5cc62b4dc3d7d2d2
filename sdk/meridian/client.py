"""
The HTTP client under every resource: the token and tenant on each request, errors as exceptions,
pages as iterators, and retries that are safe -- 429 and 503 honour ``Retry-After`` with exponential
backoff, and a create carries an ``Idempotency-Key`` (the same on each retry), so a create retried
after a network error makes one object.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import httpx

from meridian import errors
from meridian.config import resolve
from meridian.resources import attach

RETRY_STATUSES = {429, 502, 503, 504}


class Client:
    def __init__(self, url: str | None = None, token: str | None = None, tenant: str | None = None, *,
                 profile: str | None = None, retries: int = 4, backoff_s: float = 0.5, timeout_s: float = 30.0,
                 transport: httpx.BaseTransport | None = None):
        settings = resolve(url, token, tenant, profile)
        self.url, self.tenant, self.retries, self.backoff_s = settings.url, settings.tenant, retries, backoff_s
        headers = {"Accept": "application/json", "User-Agent": "meridian-sdk/0.1"}
        if settings.token:
            headers["Authorization"] = f"Bearer {settings.token}"
        if settings.tenant:
            headers["X-Meridian-Tenant"] = settings.tenant
        self.http = httpx.Client(base_url=f"{settings.url}/api/v1/", headers=headers, timeout=timeout_s,
                                 transport=transport)
        attach(self)

    def close(self) -> None:
        self.http.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def request(self, method: str, path: str, *, json=None, params=None, idempotent_create: bool = False):
        """One API call, retried where that is safe; the decoded JSON (None for 204), or a MeridianError."""
        headers = {"Idempotency-Key": str(uuid.uuid4())} if idempotent_create else {}
        safe = method in ("GET", "HEAD", "PUT", "DELETE") or idempotent_create
        for attempt in range(self.retries + 1):
            try:
                answer = self.http.request(method, path.lstrip("/"), json=json, params=params, headers=headers)
            except httpx.TransportError as exc:
                if not safe or attempt == self.retries:
                    raise errors.Unreachable(0, "unreachable", f"{self.url}: {exc}") from exc
                time.sleep(self._wait(attempt, None))
                continue
            if answer.status_code in RETRY_STATUSES and attempt < self.retries and (safe or answer.status_code == 429):
                time.sleep(self._wait(attempt, answer.headers.get("Retry-After")))
                continue
            if answer.status_code >= 400:
                try:
                    body = answer.json()
                except ValueError:
                    body = answer.text
                raise errors.from_answer(answer.status_code, body, answer.headers.get("X-Request-ID"))
            if answer.status_code == 204 or not answer.content:
                return None
            return answer.json() if "json" in answer.headers.get("Content-Type", "") else answer.text
        raise AssertionError("unreachable")

    def _wait(self, attempt: int, retry_after: str | None) -> float:
        if retry_after and retry_after.strip().isdigit():
            return min(float(retry_after), 60.0)
        return self.backoff_s * 2 ** attempt

    def pages(self, path: str, params: dict | None = None, page_size: int = 100) -> Iterator[dict]:
        """Every item of a list, page after page, as one iterator."""
        query = {**(params or {}), "page_size": page_size, "page": 1}
        while True:
            body = self.request("GET", path, params=query)
            if isinstance(body, list):
                yield from body
                return
            yield from body.get("results", [])
            if not body.get("next"):
                return
            query["page"] += 1
