"""Meridian's Python SDK: ``Client`` and the API's errors as exceptions."""

from meridian.client import Client
from meridian.errors import Conflict, Forbidden, Invalid, MeridianError, NotFound, RateLimited, Unauthorized

__all__ = ["Client", "Conflict", "Forbidden", "Invalid", "MeridianError", "NotFound", "RateLimited", "Unauthorized"]
