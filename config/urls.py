"""Top-level URLs: the console (tenant and staff pages), the API (v1, schema, docs), the Django admin."""

from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from operations import guest_api, health_views, metrics_views
from operations import views as operations_views
from provisioning import instance_views
from security.views import jwks_view
from tenants import views as tenant_views
from web import views

handler403 = "web.error_views.permission_denied"
handler404 = "web.error_views.not_found"
handler500 = "web.error_views.server_error"

urlpatterns = [
    path("", operations_views.home, name="home"),
    path("tenants/", views.tenants_choose, name="console-tenants"),
    path("switch/", views.switch, name="console-switch"),
    path("login/", views.LoginView.as_view(), name="login"),
    path("logout/", views.LogoutView.as_view(), name="logout"),
    path("invitations/accept/", tenant_views.invitation_accept, name="invitation-accept-page"),
    path("invitations/<str:secret>/", tenant_views.invitation_open, name="invitation-open"),
    path("health/", views.health, name="health"),
    # Orchestrators' probes (operations.health_views): the process, then what it needs to serve.
    path("health/live", health_views.live, name="health-live"),
    path("health/ready", health_views.ready, name="health-ready"),
    # Pages Django draws itself (the CSRF failure page) declare no icon, so browsers ask here.
    path("favicon.ico", views.no_icon),
    # Prometheus scrape: platform tokens or the metrics user only (operations.metrics_views).
    path("metrics", metrics_views.metrics, name="metrics"),
    path(".well-known/jwks.json", jwks_view, name="jwks"),
    path("api/v1/", include("config.api_router")),
    path("api/agent/v1/", include("operations.node_api.views")),
    # What instances, their BMCs and hypervisors fetch with the per-instance secret (no login).
    path("instance-data/<uuid:instance_id>/<str:token>/config-drive.iso", instance_views.config_drive,
         name="config-drive"),
    path("instance-data/<uuid:instance_id>/<str:token>/report", instance_views.report, name="instance-report"),
    path("instance-data/<uuid:instance_id>/<str:token>/spot/termination-time", instance_views.spot_termination_time,
         name="instance-spot-termination"),
    path("instance-data/<uuid:instance_id>/<str:token>/gpu-telemetry", guest_api.gpu_telemetry,
         name="instance-gpu-telemetry"),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="swagger-ui"),
    path("admin/", admin.site.urls),
    # The console's pages, app by app (each app's urls.py), and the staff console.
    path("", include("provisioning.urls")),
    path("", include("storage.views")),
    path("", include("billing.views")),
    path("", include("webhooks.views")),
    path("", include("inference.views")),
    path("", include("tenants.urls")),
    path("", include("security.urls")),
    path("", include("provisioning.sla.urls")),  # /sla/ and /staff/sla/
    path("", include("provisioning.high_priority.urls")),
    path("staff/", include("operations.staff_urls")),
]
