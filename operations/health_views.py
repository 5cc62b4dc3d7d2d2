"""
Health checks for load balancers, orchestrators and people:

- ``GET /health/live``: the process answers (no dependency asked: a database outage must not get
  every web process restarted);
- ``GET /health/ready``: 200 when this process can serve -- database, broker, cache reachable and
  every migration applied -- else 503 with which check failed. Anyone gets the verdict and the
  checks; platform staff (a platform token, the metrics user, or a staff session) also get the
  control plane's loops: the scheduler leader and the age of its last cycle, beat's last send,
  the workers answering a ping and the queue depths.
"""

from __future__ import annotations

from django.http import JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from operations import control_plane
from operations.metrics_views import may_scrape
from tenants.choices import PlatformRole


def _staff(request) -> bool:
    if may_scrape(request):
        return True
    user = getattr(request, "user", None)
    return bool(user and user.is_authenticated and user.platform_role != PlatformRole.NONE)


@never_cache
@require_GET
def live(request):
    return JsonResponse({"status": "alive"})


@never_cache
@require_GET
def ready(request):
    if _staff(request):
        status = control_plane.read()
        body = status.as_dict()
    else:
        status = control_plane.ready()
        body = {"status": "ready" if status.ready else "not_ready",
                "checks": {name: {"ok": check.ok, "ms": check.ms, "error": check.error}
                           for name, check in status.checks.items()}}
    return JsonResponse(body, status=200 if status.ready else 503)
