"""Pointing the project's Celery app at another broker for one test, and putting it back."""

from collections.abc import Iterator
from contextlib import contextmanager

from kombu import pools
from kombu.utils.collections import eqhash

from config.celery import app

KEYS = ("broker_url", "broker_transport_options", "task_default_queue")


@contextmanager
def app_on_broker(*, broker_url: str, queue: str, transport_options: dict) -> Iterator[object]:
    """
    The app publishes to ``broker_url`` on ``queue`` inside the block; afterwards it is as it was:
    its settings, its connection pool and its AMQP helper (Celery caches the broker connection
    pool in ``app._pool``, the producer pool and the queues in ``app.amqp``; kombu keeps both
    pools in global registries keyed by the connection's parameters, so the next test's app
    would get closed ones). Yields the write connection.
    """
    saved_conf = {key: app.conf[key] for key in KEYS}
    saved_pool, saved_amqp = app._pool, app.__dict__.pop("amqp", None)
    app._pool = None
    app.set_current()  # shared tasks send through the current app: make sure it is the project's
    app.conf.update(broker_url=broker_url, broker_transport_options=transport_options, task_default_queue=queue)
    connection = app.connection_for_write()
    try:
        yield connection
    finally:
        for group in (pools.producers, pools.connections):
            pool = group.pop(eqhash(connection), None)
            if pool is not None:
                pool.force_close_all()
        connection.release()
        app.conf.update(saved_conf)
        app._pool = saved_pool
        app.__dict__.pop("amqp", None)
        if saved_amqp is not None:
            app.__dict__["amqp"] = saved_amqp
