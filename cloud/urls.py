"""Top-level URLs: the console (tenant and staff pages), the API (v1, schema, docs), the Django admin."""

from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from security.views import jwks_view

from . import metrics_views, views

handler403 = "cloud.error_views.permission_denied"
handler404 = "cloud.error_views.not_found"
handler500 = "cloud.error_views.server_error"

urlpatterns = [
    path("", views.home, name="home"),
    path("tenants/", views.tenants_choose, name="console-tenants"),
    path("switch/", views.switch, name="console-switch"),
    path("login/", views.LoginView.as_view(), name="login"),
    path("logout/", views.LogoutView.as_view(), name="logout"),
    path("invitations/accept/", views.invitation_accept, name="invitation-accept-page"),
    path("invitations/<str:secret>/", views.invitation_open, name="invitation-open"),
    path("health/", views.health, name="health"),
    # Pages Django draws itself (the CSRF failure page) declare no icon, so browsers ask here.
    path("favicon.ico", views.no_icon),
    # Prometheus scrape: platform tokens or the metrics user only (cloud.metrics_views).
    path("metrics", metrics_views.metrics, name="metrics"),
    path(".well-known/jwks.json", jwks_view, name="jwks"),
    path("api/v1/", include("cloud.api.urls")),
    path("api/agent/v1/", include("provisioning.node_api")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="swagger-ui"),
    path("admin/", admin.site.urls),
    # The console's pages, app by app (each app's urls.py), and the staff console.
    path("", include("provisioning.urls")),
    path("", include("tenants.urls")),
    path("", include("security.urls")),
    path("", include("provisioning.sla_urls")),  # /sla/ and /staff/sla/
    path("", include("tenants.high_priority_urls")),
    path("staff/", include("cloud.staff_urls")),
]
