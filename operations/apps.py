from django.apps import AppConfig


class OperationsConfig(AppConfig):
    """Fleet operations: incident detection, the node API, BMC collection, alerts, metrics, staff pages."""

    name = "operations"
    verbose_name = "Fleet operations"
