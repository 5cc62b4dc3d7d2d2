from django.apps import AppConfig


class WebConfig(AppConfig):
    """The web layer every app's API and console builds on (and the console's static files)."""

    name = "web"
    verbose_name = "Web"
