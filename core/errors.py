"""
Domain errors raised by services. Each carries its HTTP status and a stable machine-readable
code, so the API's one exception handler (web.api.errors) and the console map them the same way.
"""

from rest_framework import status
from rest_framework.exceptions import APIException


class DomainError(APIException):
    """Base of the errors a service raises on purpose."""

    status_code = status.HTTP_400_BAD_REQUEST
    default_code = "invalid"
    default_detail = "The request cannot be carried out."

    def __init__(self, detail=None, code=None, **meta):
        super().__init__(detail=detail, code=code)
        self.meta = meta


class Conflict(DomainError):
    """The request clashes with the current state of the object (409)."""

    status_code = status.HTTP_409_CONFLICT
    default_code = "conflict"
    default_detail = "The request conflicts with the current state."


class InvalidTransition(Conflict):
    """A state move the transition table forbids; names the current state."""

    default_code = "invalid_transition"

    def __init__(self, *, model: str, current: str, target: str):
        super().__init__(
            f"The {model} is '{current}' and cannot move to '{target}'.",
            current_state=current,
            target_state=target,
        )


class QuotaExceeded(Conflict):
    """Asking for more than a quota allows; carries the numbers."""

    default_code = "quota_exceeded"

    # How the sentence names a resource (``meta`` keeps the API's name).
    RESOURCE_WORDS = {"gpus": "GPUs", "vpcs": "VPCs", "instances": "concurrent instances"}

    def __init__(self, *, scope: str, resource: str, limit: int, in_use: int, asked: int):
        first, _, rest = resource.partition(" ")
        words = " ".join(filter(None, [self.RESOURCE_WORDS.get(first, first), rest]))
        super().__init__(
            f"The {scope} quota for {words} is {_count(limit)}; {_count(in_use)} in use, {_count(asked)} asked.",
            scope=scope, resource=resource, limit=limit, in_use=in_use, asked=asked,
        )


def _count(value) -> str:
    """A count for a sentence: a slot's share of a GPU to one decimal (0.1, not 0.14285714285714285)."""
    text = f"{round(float(value), 1):.1f}".removesuffix(".0")
    return "0.1" if text == "0" and value > 0 else text


class Unavailable(DomainError):
    """What the request needs (a host, a driver) cannot be reached now; worth trying again (503)."""

    status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    default_code = "unavailable"
    default_detail = "The service needed for this request is unavailable; try again shortly."


class Forbidden(DomainError):
    """The principal may see the object but not do this to it (403)."""

    status_code = status.HTTP_403_FORBIDDEN
    default_code = "permission_denied"
    default_detail = "You do not have permission to perform this action."


def invalid(field: str, message: str, code: str = "invalid") -> DomainError:
    """A 400 on ``field``: the name of the request's field, so the client knows what to change."""
    return DomainError({field: [message]}, code=code)
