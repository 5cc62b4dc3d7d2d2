"""Public security endpoints, outside the API: no authentication, nothing tenant-specific."""

from django.http import JsonResponse
from django.views.decorators.cache import cache_control
from django.views.decorators.http import require_GET

from .receipts import jwks


@require_GET
@cache_control(public=True, max_age=300)
def jwks_view(request):
    """
    The receipt keys' JWKS, public so tenants can verify receipts offline. Cached briefly: a
    client that meets an unknown kid should fetch it again.
    """
    return JsonResponse(jwks())
