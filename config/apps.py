from django.apps import AppConfig


class ConfigConfig(AppConfig):
    """The project package as an app: its management commands (up, seed_demo) and system checks."""

    name = "config"
    verbose_name = "Meridian"

    def ready(self):
        from config import checks  # noqa: F401 -- registers the system checks
