from django.apps import AppConfig


class InferenceConfig(AppConfig):
    name = "inference"
    verbose_name = "Inference endpoints"

    def ready(self):
        from inference import balancer, tasks  # the apps' models load first

        balancer.register(on_change=tasks.balancer_sync_soon)
