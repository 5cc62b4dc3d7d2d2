"""
``Idempotency-Key`` on creates (IETF draft-ietf-httpapi-idempotency-key-header, Stripe's rules).

The same key and body replay the first response (``Idempotent-Replayed: true``); the same key
with another body is a 422; a retry while the first is still running is a 409. Keys are scoped
to the tenant and the user, checked after authentication, and stored in the same transaction as
what the create wrote -- so a crash after the commit replays, never creates twice. A request that
fails (4xx) stores nothing and may be retried with the same key.
"""

from __future__ import annotations

import hashlib
import json

from django.db import connection, transaction
from rest_framework import status
from rest_framework.exceptions import APIException, ValidationError
from rest_framework.response import Response

from provisioning.models import IdempotencyKey

HEADER = "Idempotency-Key"
REPLAYED = "Idempotent-Replayed"


class IdempotencyKeyReused(APIException):
    status_code = status.HTTP_422_UNPROCESSABLE_ENTITY
    default_code = "idempotency_key_reused"
    default_detail = "This Idempotency-Key was used with a different request body; use a new key."


class IdempotencyInProgress(APIException):
    status_code = status.HTTP_409_CONFLICT
    default_code = "idempotency_in_progress"
    default_detail = "A request with this Idempotency-Key is still being processed; retry shortly."


def _fingerprint(request) -> str:
    body = json.dumps(request.data, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(f"{request.method} {request.path}\n{body}".encode()).hexdigest()


def _lock_key(*parts) -> int:
    digest = hashlib.sha256(":".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


class IdempotentCreateMixin:
    """Wraps ``create`` of a viewset; the viewset implements ``create_once(request)``."""

    def create(self, request, *args, **kwargs):
        key = request.headers.get(HEADER)
        if key is None:
            return self.create_once(request)
        if not 1 <= len(key) <= 255 or not key.isprintable():
            raise ValidationError({HEADER: ["Use 1 to 255 printable characters (a UUID is a good key)."]},
                                  code="invalid")
        principal = request.principal
        tenant_id = getattr(principal.tenant, "pk", None)
        scope = {"tenant_id": tenant_id, "principal_id": principal.user.pk, "key": key}
        fingerprint = _fingerprint(request)
        with transaction.atomic():
            if connection.vendor == "postgresql":
                with connection.cursor() as cursor:
                    cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [_lock_key(*scope.values())])
                    if not cursor.fetchone()[0]:
                        raise IdempotencyInProgress()
            stored = IdempotencyKey.objects.filter(**scope).first()
            if stored is not None:
                if stored.request_sha256 != fingerprint:
                    raise IdempotencyKeyReused()
                return Response(stored.response_body, status=stored.response_code, headers={REPLAYED: "true"})
            response = self.create_once(request)
            IdempotencyKey.objects.create(**scope, method=request.method, path=request.path[:255],
                                          request_sha256=fingerprint, response_code=response.status_code,
                                          response_body=json.loads(json.dumps(response.data, default=str)))
            return response
