"""The URLconf of the node API's own handler (operations.node_api.handler): the node API and nothing else."""

from django.urls import include, path

handler404 = "web.api.errors.api_not_found"
handler500 = "web.api.errors.api_server_error"

urlpatterns = [
    path("api/agent/v1/", include("operations.node_api.views")),
]
