from django.apps import AppConfig


class TenantsConfig(AppConfig):
    name = "tenants"
    verbose_name = "Tenants and identity"

    def ready(self):
        from tenants.api import schema  # noqa: F401 -- registers the OpenAPI auth scheme
        from tenants.quotas import watch_quotas
        from tenants.token_cache import watch_auth

        watch_auth()
        watch_quotas()
