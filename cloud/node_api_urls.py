"""The URLconf of the node API's own handler (cloud.handlers): the node API and nothing else."""

from django.urls import include, path

handler404 = "cloud.api.errors.api_not_found"
handler500 = "cloud.api.errors.api_server_error"

urlpatterns = [
    path("api/agent/v1/", include("provisioning.node_api")),
]
