"""
gunicorn's settings for the image's web role (``deploy/entrypoint.sh web``), from the environment.

GUNICORN_WORKERS (default 4) processes of GUNICORN_THREADS (default 4) threads each; size the
workers to the CPUs the container may use, not the host's (os.cpu_count() sees the host).
"""

import os

bind = f"{os.environ.get('MERIDIAN_BIND', '0.0.0.0')}:{os.environ.get('MERIDIAN_PORT', '8000')}"  # noqa: S104
workers = int(os.environ.get("GUNICORN_WORKERS", "4"))
threads = int(os.environ.get("GUNICORN_THREADS", "4"))
worker_class = "gthread"
# A request slower than this is killed with its worker; the API's slowest pages stay well below.
timeout = int(os.environ.get("GUNICORN_TIMEOUT", "60"))
# On SIGTERM (a rolling update) requests in flight get this long to finish; keep it below the
# orchestrator's grace period (Kubernetes' terminationGracePeriodSeconds, Compose's stop_grace_period).
graceful_timeout = int(os.environ.get("GUNICORN_GRACEFUL_TIMEOUT", "25"))
# Behind a proxy or load balancer that keeps connections open: longer than its idle timeout would race it.
keepalive = int(os.environ.get("GUNICORN_KEEPALIVE", "5"))
# Workers are replaced after this many requests (jittered, so they do not all restart together).
max_requests = int(os.environ.get("GUNICORN_MAX_REQUESTS", "5000"))
max_requests_jitter = max_requests // 10
# Heartbeat files on memory, not on the container's (possibly read-only) disk.
worker_tmp_dir = os.environ.get("GUNICORN_WORKER_TMP_DIR", "/dev/shm")  # noqa: S108
# No control socket: it would be written under the (read-only) home folder, and nothing uses it.
control_socket_disable = True
# Proxies whose X-Forwarded-Proto gunicorn believes; Django's own rule is MERIDIAN_BEHIND_TLS_PROXY.
forwarded_allow_ips = os.environ.get("GUNICORN_FORWARDED_ALLOW_IPS", "127.0.0.1,::1")

accesslog = "-"
errorlog = "-"
loglevel = os.environ.get("MERIDIAN_LOG_LEVEL", "info").lower()
# The node agents' routine calls (heartbeats, command polls) are logged at debug only.
logger_class = "config.access_log.AccessLogger"


def child_exit(server, worker):
    """A dead worker's live gauges leave /metrics (prometheus_client's multiprocess mode)."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(worker.pid)
