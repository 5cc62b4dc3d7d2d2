"""
The Celery application: configured from Django settings (CELERY_ namespace). Its signals carry a
request's id and tenant to the tasks it queues (their log lines say which request they serve) and
turn tracing on in worker and beat processes when it is asked for (config.tracing).
"""

import os

from celery import Celery, signals
from celery.contrib.django.task import DjangoTask

from config import tracing
from config.broker import use_atomic_messages
from config.logging_json import json_logs
from core import log_context
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


#
# Log context: a task's lines carry its name and id, and the id and tenant of the request that queued it
#


@signals.before_task_publish.connect(weak=False, dispatch_uid="meridian.log_context.publish")
def _carry_request(headers=None, **_):
    if headers is not None:
        headers.update(log_context.publish_headers())


_task_contexts: dict = {}  # task id -> the token that restores the context the task replaced


@signals.task_prerun.connect(weak=False, dispatch_uid="meridian.log_context.prerun")
def _enter_task(task_id=None, task=None, **_):
    request, outer = task.request, log_context.current()
    request_id = getattr(request, log_context.REQUEST_ID_HEADER, None)
    tenant = getattr(request, log_context.TENANT_HEADER, None)
    if request_id is None and outer is not None:  # run in place (eagerly) while serving a request
        request_id, tenant = outer.request_id, outer.tenant
    context = log_context.LogContext(request_id=request_id, tenant=tenant, task_name=task.name, task_id=task_id)
    _task_contexts[task_id] = log_context.enter(context)


@signals.task_postrun.connect(weak=False, dispatch_uid="meridian.log_context.postrun")
def _leave_task(task_id=None, **_):
    token = _task_contexts.pop(task_id, None)
    if token is not None:
        log_context.leave(token)


if json_logs():
    @signals.setup_logging.connect(weak=False, dispatch_uid="meridian.logging")
    def _django_logging(**_):
        """Django's LOGGING (JSON lines at MERIDIAN_LOG_LEVEL) stays the worker's and beat's: Celery adds none."""


#
# Tracing (off unless MERIDIAN_TRACING=1): each pool process of a worker, a worker without a pool of processes, beat
#


@signals.worker_process_init.connect(weak=False, dispatch_uid="meridian.tracing.worker_process")
def _trace_pool_process(**_):
    tracing.setup("worker")


@signals.worker_init.connect(weak=False, dispatch_uid="meridian.tracing.worker")
def _trace_worker(sender=None, **_):
    pool = getattr(sender, "pool_cls", "prefork")
    name = pool if isinstance(pool, str) else f"{pool.__module__}.{pool.__qualname__}"
    if "prefork" not in name.lower():  # prefork's processes are set up each in worker_process_init
        tracing.setup("worker")


@signals.beat_init.connect(weak=False, dispatch_uid="meridian.tracing.beat")
def _trace_beat(**_):
    tracing.setup("beat")
