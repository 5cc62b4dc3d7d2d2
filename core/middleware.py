"""Request-wide plumbing: a request id for logs and audit events, and the body size limit."""

import contextvars
import io
import re
import uuid

from django.conf import settings
from django.http import JsonResponse

from core import log_context, tracing

_request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("request_id", default=None)
_CLIENT_ID = re.compile(r"^[A-Za-z0-9._-]{8,64}$")


def current_request_id() -> str | None:
    """The id of the request being served, or None outside a request (tasks, commands)."""
    return _request_id.get()


class RequestIdMiddleware:
    """
    Give every request an id (the client's ``X-Request-ID`` when well-formed) and echo it; its log
    lines carry it, and the tenant once authentication knows it (core.log_context), as does the
    access line (the context stays in the WSGI environ for it).
    """

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        offered = request.headers.get("X-Request-ID", "")
        request.id = offered if _CLIENT_ID.match(offered) else uuid.uuid4().hex
        context = log_context.LogContext(request_id=request.id)
        request.META[log_context.ENVIRON_KEY] = context
        tracing.annotate(request_id=request.id)
        token, logged = _request_id.set(request.id), log_context.enter(context)
        try:
            response = self.get_response(request)
        finally:
            log_context.leave(logged)
            _request_id.reset(token)
        response["X-Request-ID"] = request.id
        return response


def error_body(status_type: str, code: str, detail: str, attr: str | None = None) -> dict:
    """The one error shape every 4xx/5xx of the API has (drf-standardized-errors)."""
    return {"type": status_type, "errors": [{"code": code, "detail": detail, "attr": attr}]}


class BodySizeLimitMiddleware:
    """
    Refuse a body larger than DATA_UPLOAD_MAX_MEMORY_SIZE with a JSON 413 before anything reads it.

    Django only enforces the limit when ``request.body`` is read; DRF's parsers read the stream
    directly, so without this a 5 MB JSON body would be parsed in full.
    """

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        try:
            length = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            length = 0
        if limit is not None and (length > limit or request.META.get(CHUNKED_OVER_LIMIT)):
            size = f"more than {limit}" if request.META.get(CHUNKED_OVER_LIMIT) else str(length)
            body = error_body(
                "client_error",
                "request_too_large",
                f"The request body is {size} bytes; the limit is {limit} bytes.",
            )
            return JsonResponse(body, status=413)
        return self.get_response(request)


CHUNKED_OVER_LIMIT = "meridian.chunked_body_over_limit"
_READ_SIZE = 65_536


def chunked_bodies(application):
    """
    WSGI: a chunked body (``Transfer-Encoding: chunked``, so no Content-Length) read whole, up to the
    body limit, and handed on with its length, as any body. Django reads only CONTENT_LENGTH bytes of
    a request, none without one, so a chunked create came in empty, and its size went unchecked.
    One over the limit is read no further and handed on empty, marked, for BodySizeLimitMiddleware's 413.
    """

    def read_chunked(environ, start_response):
        if "chunked" in environ.get("HTTP_TRANSFER_ENCODING", "").lower() and not environ.get("CONTENT_LENGTH"):
            limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
            body = _read(environ["wsgi.input"], None if limit is None else limit + 1)
            if limit is not None and len(body) > limit:
                environ[CHUNKED_OVER_LIMIT], body = True, b""
            environ["wsgi.input"], environ["CONTENT_LENGTH"] = io.BytesIO(body), str(len(body))
        return application(environ, start_response)

    return read_chunked


def _read(stream, most: int | None) -> bytes:
    """Up to ``most`` bytes of ``stream`` (all of it when None)."""
    parts, size = [], 0
    while most is None or size < most:
        part = stream.read(_READ_SIZE if most is None else min(_READ_SIZE, most - size))
        if not part:
            break
        parts.append(part)
        size += len(part)
    return b"".join(parts)
