from django.apps import AppConfig


class CloudConfig(AppConfig):
    name = "cloud"
    verbose_name = "Inventory"

    def ready(self):
        from cloud.catalogue_cache import watch_catalogue

        watch_catalogue()
