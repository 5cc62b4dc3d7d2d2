"""
The API's one error format (drf-standardized-errors), extended for domain errors:

    {"type": "client_error", "errors": [{"code": "quota_exceeded", "detail": "...", "attr": null,
                                         "meta": {"limit": 8, "in_use": 6, "asked": 4}}]}

Database conflicts that slip past a service's checks (a unique race, a protected delete) are a
409, never a 500. A transient database error (``core.transient``: the connection lost, a
serialization failure, a deadlock) rolled the request back whole: a 503 ``database_unavailable``
with ``Retry-After``, safe to send again (with the same Idempotency-Key for a create). Unknown
/api/ URLs get the same shape (``not_found``).

An answer stays small whatever the body carried: the first ``MAX_ERRORS`` errors, then one
``too_many_errors`` saying how many more; a detail or attr that repeats a long value is cut short.
"""

import logging
import sys
from dataclasses import asdict

from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import IntegrityError
from django.db.models import ProtectedError
from django.http import JsonResponse
from drf_standardized_errors import formatter, handler
from drf_standardized_errors.types import Error
from rest_framework import exceptions, status

from core.errors import Conflict
from core.middleware import error_body
from core.transient import RETRY_AFTER_S, fresh_connections, transient_database_error

log = logging.getLogger(__name__)


class DatabaseUnavailable(exceptions.APIException):
    """The database was unreachable for a moment (or aborted the transaction); nothing was changed."""

    status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    default_code = "database_unavailable"
    default_detail = ("The database was briefly unavailable and nothing was changed; send the request again in a "
                      "few seconds (a create with the same Idempotency-Key).")
    wait = RETRY_AFTER_S  # the Retry-After header


class ExceptionHandler(handler.ExceptionHandler):
    def convert_known_exceptions(self, exc):
        if transient_database_error(exc):
            fresh_connections()  # the next request on this thread gets a working connection
            return DatabaseUnavailable()
        if isinstance(exc, ProtectedError):
            return Conflict("The object is still in use by other objects; remove those first.", code="protected")
        if isinstance(exc, IntegrityError):
            return Conflict("The change conflicts with existing data (a duplicate or a concurrent change).",
                            code="integrity_conflict")
        if isinstance(exc, DjangoValidationError):
            detail = exc.message_dict if hasattr(exc, "error_dict") else exc.messages
            return exceptions.ValidationError(detail)
        return super().convert_known_exceptions(exc)

    def report_exception(self, exc, response):
        if isinstance(exc, DatabaseUnavailable):
            # Handled, not a crash: one line for the operator, no error report (the client retries).
            log.warning("database unavailable during %s: %s", getattr(self.context.get("request"), "path", "?"),
                        self.exc)
            return
        super().report_exception(exc, response)


MAX_ERRORS = 20
MAX_DETAIL_CHARS = 500
MAX_ATTR_CHARS = 200


def _leaves(detail) -> int:
    """How many errors a DRF error detail (nested lists and mappings of ErrorDetail) holds."""
    if isinstance(detail, dict):
        return sum(_leaves(value) for value in detail.values())
    if isinstance(detail, list):
        return sum(_leaves(value) for value in detail)
    return 1 if detail or detail == "" else 0


def _first(detail, n: int):
    """``detail`` with each list and mapping cut to its first ``n`` entries: flattened, still the first errors."""
    if isinstance(detail, dict):
        return {key: _first(value, n) for key, value in list(detail.items())[:n]}
    if isinstance(detail, list):
        return [_first(value, n) for value in detail[:n]]
    return detail


def _cut(text: str | None, limit: int) -> str | None:
    return text if text is None or len(text) <= limit else text[:limit - 1] + "…"


class ExceptionFormatter(formatter.ExceptionFormatter):
    def get_errors(self):
        total = _leaves(self.exc.detail)
        errors = [Error(error.code, _cut(error.detail, MAX_DETAIL_CHARS), _cut(error.attr, MAX_ATTR_CHARS))
                  for error in formatter.flatten_errors(_first(self.exc.detail, MAX_ERRORS))[:MAX_ERRORS]]
        if total > len(errors):
            errors.append(Error("too_many_errors", f"{total - len(errors)} more errors are not shown; correct these "
                                                   "and send the request again.", None))
        return errors

    def get_error_type(self):
        if self.exc.status_code == status.HTTP_400_BAD_REQUEST and isinstance(self.exc.detail, dict):
            return formatter.VALIDATION_ERROR
        return super().get_error_type()

    def format_error_response(self, error_response):
        data = asdict(error_response)
        meta = getattr(self.exc, "meta", None)
        if meta:
            for error in data["errors"]:
                error["meta"] = meta
        return data


def api_not_found(request, exception=None):
    """JSON 404 for unknown URLs under /api/; elsewhere Django's page (the console draws its own: web.error_views)."""
    from django.views.defaults import page_not_found

    if request.path.startswith("/api/"):
        return JsonResponse(error_body("client_error", "not_found", "No API endpoint matches this URL."), status=404)
    return page_not_found(request, exception)


def api_server_error(request):
    from django.views.defaults import server_error

    if request.path.startswith("/api/"):
        if transient_database_error(sys.exc_info()[1]):  # raised outside a view (authentication middleware)
            fresh_connections()
            body = error_body("server_error", DatabaseUnavailable.default_code, DatabaseUnavailable.default_detail)
            return JsonResponse(body, status=503, headers={"Retry-After": str(RETRY_AFTER_S)})
        return JsonResponse(error_body("server_error", "error", "Server Error (500)"), status=500)
    return server_error(request)
