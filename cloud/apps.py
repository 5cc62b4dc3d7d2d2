from django.apps import AppConfig


class CloudConfig(AppConfig):
    name = "cloud"
    verbose_name = "Inventory"

    def ready(self):
        from . import checks  # noqa: F401 -- registers the system checks
        from .catalogue_cache import watch_catalogue

        watch_catalogue()
