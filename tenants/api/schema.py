"""OpenAPI description of Meridian's bearer tokens (drf-spectacular extension)."""

from drf_spectacular.extensions import OpenApiAuthenticationExtension


class APITokenScheme(OpenApiAuthenticationExtension):
    target_class = "tenants.authentication.APITokenAuthentication"
    name = "apiToken"

    def get_security_definition(self, auto_schema):
        return {
            "type": "http",
            "scheme": "bearer",
            "bearerFormat": "mrd_<prefix>_<secret>",
            "description": "An API token created at /api/v1/api-tokens/ (shown once).",
        }
