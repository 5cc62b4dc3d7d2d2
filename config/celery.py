"""The Celery application: configured from Django settings (CELERY_ namespace)."""

import os

from celery import Celery
from celery.contrib.django.task import DjangoTask

from config.broker import use_atomic_messages
from core.transient import RETRY_AFTER_S, fresh_connections, transient_database_error

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

# A database that stays away longer than these retries (about four minutes) leaves the work to
# the reconcilers (the lifecycle tick resumes operations stuck past MERIDIAN_STUCK_AFTER).
DATABASE_RETRIES = 12
DATABASE_RETRY_MAX_S = 30


class MeridianTask(DjangoTask):
    """
    Every task of the project. A transient database error (``core.transient``: the connection
    was lost, a serialization failure, a deadlock) rolled back whatever the task was writing, so
    the task runs again within seconds, on a fresh connection -- tasks are idempotent -- instead of
    failing: a failed task is acknowledged, and its work would wait for a reconciler for minutes.
    """

    def __call__(self, *args, **kwargs):
        request = self.request  # the worker's, with the retry count (a direct call has none)
        try:
            return super().__call__(*args, **kwargs)
        except Exception as exc:
            if request.called_directly or not transient_database_error(exc):
                raise
            fresh_connections()
            delay = min(RETRY_AFTER_S * 2 ** (request.retries or 0), DATABASE_RETRY_MAX_S)
            raise self.retry(exc=exc, countdown=delay,
                             max_retries=max(self.max_retries or 0, DATABASE_RETRIES)) from exc


app = Celery("cloud", task_cls=MeridianTask)
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

use_atomic_messages()  # the embedded default's file-system broker (a no-op for RabbitMQ)
