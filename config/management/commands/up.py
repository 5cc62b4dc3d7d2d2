"""
Run all of Meridian on this machine: ``manage.py up`` (what ``make run`` calls).

Migrates, seeds the demo world on the first run (the data folder keeps it afterwards), then
starts the web server, a Celery worker and beat under one supervisor and prints where to sign
in. Ctrl-C stops every child.
"""

import http.client
import os
import shutil
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import connection

from cloud.models import Region
from config.demo import DEMO_PASSWORD, DEMO_USERS
from config.supervisor import Child, Supervisor
from provisioning.history import history_sample
from storage.catalogue import default_storage_classes

LOOPBACK = {"127.0.0.1", "localhost", "::1"}


def web_argv(venv_bin: Path, host: str, port: int, workers: int) -> list[str]:
    """gunicorn for the console and the APIs: its access log keeps the node agents' routine calls at debug."""
    return [str(venv_bin / "gunicorn"), "config.wsgi:application", "--bind", f"{host}:{port}",
            "--workers", str(workers), "--threads", "4", "--access-logfile", "-",
            "--logger-class", "config.access_log.AccessLogger",
            "--log-level", os.environ.get("MERIDIAN_LOG_LEVEL", "info").lower()]


class Command(BaseCommand):
    help = "Start Meridian (web console + API, worker, beat) on the embedded default, with a demo fleet."

    def add_arguments(self, parser):
        parser.add_argument("--host", default=os.environ.get("MERIDIAN_HOST", "127.0.0.1"))
        parser.add_argument("--port", type=int, default=int(os.environ.get("MERIDIAN_PORT", "8000")))
        parser.add_argument("--reset", action="store_true",
                            help="Start from an empty database (embedded SQLite only).")
        parser.add_argument("--web-workers", type=int, default=2)

    def handle(self, *args, host, port, reset, web_workers, **options):
        if reset:
            self._reset()
        self.stdout.write(f"Data folder: {settings.DATA_DIR}")
        call_command("migrate", interactive=False, verbosity=0)
        call_command("seed_demo", verbosity=1)
        for region in Region.objects.all():  # a data folder from before storage gets its classes too
            default_storage_classes(region)
        history_sample()  # the console's charts start from now, not from the first beat
        call_command("collectstatic", interactive=False, verbosity=0)
        connection.close()

        base_url = f"http://{host if ':' not in host else f'[{host}]'}:{port}"
        env = self._child_env(host, base_url)
        venv_bin = Path(sys.executable).parent
        children = [
            Child("web", web_argv(venv_bin, host, port, web_workers)),
            Child("worker", [str(venv_bin / "celery"), "-A", "config", "worker", "--concurrency", "2",
                             "--hostname", "worker@%h", "--without-mingle", "--without-gossip",
                             "--loglevel", "INFO"]),
            Child("beat", [str(venv_bin / "celery"), "-A", "config", "beat", "--loglevel", "INFO"]),
            Child("scheduler", [sys.executable, str(Path(settings.BASE_DIR) / "manage.py"), "run_scheduler"]),
            Child("agents", [sys.executable, str(Path(settings.BASE_DIR) / "manage.py"), "run_agents",
                             "--url", base_url]),
        ]
        code = 0
        with Supervisor(children, env=env) as supervisor:  # stops every child however this block ends
            supervisor.start()
            if self._wait_healthy(f"{base_url}/health/", children):
                self._banner(base_url)
                code = supervisor.wait()
            else:
                self.stderr.write("The web server did not come up; see its output above.")
                code = 1
        self.stdout.write("Meridian stopped.")
        if code:
            sys.exit(code)

    def _reset(self):
        if connection.vendor != "sqlite":
            raise CommandError("--reset only clears the embedded SQLite database; drop a PostgreSQL one yourself.")
        data = Path(settings.DATA_DIR)
        db = Path(settings.DATABASES["default"]["NAME"])
        for path in [db, Path(f"{db}-wal"), Path(f"{db}-shm")]:
            path.unlink(missing_ok=True)
        shutil.rmtree(data / "broker", ignore_errors=True)
        for key in ("data_folder_in", "control_folder"):  # empty again, and there: the seed sends tasks
            Path(settings.CELERY_BROKER_TRANSPORT_OPTIONS[key]).mkdir(parents=True, exist_ok=True)
        # The audit heads published for the old database would make the new chain look truncated;
        # they are kept, beside the folder audit_verify reads.
        heads = Path(settings.MERIDIAN_AUDIT_HEAD_DIR)
        if heads.exists():
            heads.rename(heads.with_name(f"{heads.name}-before-reset-{time.strftime('%Y%m%dT%H%M%S')}"))
        self.stdout.write("Reset: the embedded database and queues are empty again.")

    def _child_env(self, host: str, base_url: str) -> dict[str, str]:
        env = dict(os.environ)
        env.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
        env["MERIDIAN_DATA_DIR"] = str(settings.DATA_DIR)
        env.setdefault("MERIDIAN_PUBLIC_URL", base_url)
        # The local run serves plain HTTP; HTTPS-only cookies and redirects would lock the browser out.
        env.setdefault("MERIDIAN_SECURE_TRANSPORT", "0")
        # A webhook receiver on this machine can be tried out (production refuses loopback and http).
        env.setdefault("MERIDIAN_WEBHOOK_ALLOW_LOOPBACK", "1")
        if host not in LOOPBACK and "DJANGO_ALLOWED_HOSTS" not in os.environ:
            env["DJANGO_ALLOWED_HOSTS"] = ",".join(["127.0.0.1", "localhost", host])
        env["PYTHONUNBUFFERED"] = "1"
        # A sample of the queue and the fleet a minute (not five): the charts fill while one looks.
        env.setdefault("MERIDIAN_HISTORY_SAMPLE_SECONDS", "60")
        if "PROMETHEUS_MULTIPROC_DIR" not in os.environ:
            # /metrics shows the web's and the worker's requests and tasks as one (prometheus_client
            # multiprocess mode): one folder for all the children, emptied at each start.
            metrics_dir = settings.DATA_DIR / "metrics"
            shutil.rmtree(metrics_dir, ignore_errors=True)
            metrics_dir.mkdir(parents=True)
            env["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir)
        return env

    def _wait_healthy(self, url: str, children: list[Child], timeout: float = 60.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not children[0].alive:
                return False
            try:
                with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310 -- our own http:// URL
                    if response.status == 200:
                        return True
            except (urllib.error.URLError, OSError, http.client.HTTPException):
                pass
            time.sleep(0.3)
        return False

    def _banner(self, base_url: str):
        width = max(len(email) for email, *_ in DEMO_USERS)
        lines = [
            "",
            "=" * 72,
            f"  Meridian is running: {base_url}/",
            f"  API: {base_url}/api/v1/   docs: {base_url}/api/docs/   admin: {base_url}/admin/",
            f"  Demo logins (password {DEMO_PASSWORD}):",
            *[
                f"    {email.ljust(width)}  {platform_role or f'{role} of {tenant}'}"
                for email, _name, tenant, role, platform_role, _teams in DEMO_USERS
            ],
            "  Press Ctrl-C to stop.",
            "=" * 72,
            "",
        ]
        self.stdout.write("\n".join(lines))
        self.stdout.flush()
