from django.apps import AppConfig


class SecurityConfig(AppConfig):
    name = "security"
    verbose_name = "Security and audit"
