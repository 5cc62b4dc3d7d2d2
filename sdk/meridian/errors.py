"""The API's errors as exceptions: each carries the machine-readable code, the field and the request id."""

from __future__ import annotations


class MeridianError(Exception):
    """An error answer of the API (or no answer at all: ``status`` 0)."""

    def __init__(self, status: int, code: str, detail: str, *, attr: str | None = None, meta: dict | None = None,
                 request_id: str | None = None, errors: list | None = None):
        super().__init__(f"{status} {code}: {detail}" + (f" ({attr})" if attr else ""))
        self.status, self.code, self.detail, self.attr = status, code, detail, attr
        self.meta, self.request_id, self.errors = meta or {}, request_id, errors or []


class Unreachable(MeridianError):
    """No answer: the network failed or the server is down (after the retries)."""


class Invalid(MeridianError):
    """400: the request names something wrong; ``attr`` says which field."""


class Unauthorized(MeridianError):
    """401: no token, or a token that is expired or revoked."""


class Forbidden(MeridianError):
    """403: the token's role may not do this."""


class NotFound(MeridianError):
    """404: no such object, or one this token may not see."""


class Conflict(MeridianError):
    """409: the object's state forbids it now (``meta`` often says which state)."""


class RateLimited(MeridianError):
    """429 after the retries."""


class Unavailable(MeridianError):
    """503 after the retries."""


BY_STATUS = {400: Invalid, 401: Unauthorized, 403: Forbidden, 404: NotFound, 409: Conflict, 429: RateLimited,
             503: Unavailable}


def from_answer(status: int, body, request_id: str | None) -> MeridianError:
    """The exception for an error answer: the API's ``{"type", "errors": [{"code", "detail", "attr"}]}``."""
    errors = body.get("errors") if isinstance(body, dict) else None
    first = errors[0] if errors else {"code": f"http_{status}", "detail": str(body)[:300]}
    cls = BY_STATUS.get(status, MeridianError)
    return cls(status, first.get("code", f"http_{status}"), first.get("detail", ""), attr=first.get("attr"),
               meta=first.get("meta"), request_id=request_id, errors=errors)
