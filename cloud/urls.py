"""Top-level URLs: the console, the API (v1, schema, docs), the Django admin for staff."""

from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from security.views import jwks_view

from . import views

handler404 = "cloud.api.errors.api_not_found"
handler500 = "cloud.api.errors.api_server_error"

urlpatterns = [
    path("", views.home, name="home"),
    path("login/", views.LoginView.as_view(), name="login"),
    path("logout/", views.LogoutView.as_view(), name="logout"),
    path("invitations/accept/", views.invitation_accept, name="invitation-accept-page"),
    path("invitations/<str:secret>/", views.invitation_open, name="invitation-open"),
    path("health/", views.health, name="health"),
    path(".well-known/jwks.json", jwks_view, name="jwks"),
    path("api/v1/", include("cloud.api.urls")),
    path("api/agent/v1/", include("provisioning.node_api")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="swagger-ui"),
    path("admin/", admin.site.urls),
]
