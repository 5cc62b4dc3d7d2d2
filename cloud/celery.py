"""The Celery application: configured from Django settings (CELERY_ namespace)."""

import os

from celery import Celery

from cloud.broker import use_atomic_messages

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "cloud.settings")

app = Celery("cloud", task_cls="celery.contrib.django.task:DjangoTask")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

use_atomic_messages()  # the embedded default's file-system broker (a no-op for RabbitMQ)
