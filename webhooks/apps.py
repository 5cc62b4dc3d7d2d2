from django.apps import AppConfig


class WebhooksConfig(AppConfig):
    name = "webhooks"
    verbose_name = "Webhooks"

    def ready(self):
        from webhooks import tasks  # the apps' models load first
        from webhooks.delivery import enqueue_with, register

        register()
        enqueue_with(tasks.deliver.delay)
