from django.apps import AppConfig


class CloudConfig(AppConfig):
    name = "cloud"
    verbose_name = "Inventory"
