"""
The Dockerfile and its entrypoint, checked without a Docker daemon (none runs here, so the image
is never built in these tests): the Dockerfile parsed (stages, user, what it installs and copies),
and what the entrypoint's roles run exists and starts, as far as it can here.
"""

from __future__ import annotations

import configparser
import fnmatch
import http.server
import os
import re
import shlex
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from prometheus_client import multiprocess

ROOT = Path(__file__).resolve().parents[2]
ENTRYPOINT = ROOT / "deploy" / "entrypoint.sh"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order: continuation lines joined, comments and blank lines left out."""
    joined, pending = [], ""
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        joined.append(pending + stripped)
        pending = ""
    assert not pending, "the Dockerfile ends inside a continued line"
    return [(text.split(None, 1)[0].upper(), text.split(None, 1)[1] if " " in text else "") for text in joined]


def stages() -> list[list[tuple[str, str]]]:
    found: list[list[tuple[str, str]]] = []
    for instruction in instructions():
        if instruction[0] == "FROM":
            found.append([])
        if found:
            found[-1].append(instruction)
    return found


def entrypoint_roles() -> set[str]:
    text = ENTRYPOINT.read_text()
    body = text[text.index('case "$role" in\n  web)'):]
    return set(re.findall(r"^  ([a-z-]+)\)", body, re.MULTILINE))


def test_multi_stage_on_python_311_slim():
    args = dict(a.split("=", 1) for kind, a in instructions() if kind == "ARG" and "=" in a)
    assert re.fullmatch(r"python:3\.11-slim(-\w+)?", args["PYTHON_IMAGE"])
    froms = [arguments.split() for kind, arguments in instructions() if kind == "FROM"]
    assert [f[0] for f in froms] == ["${PYTHON_IMAGE}", "${PYTHON_IMAGE}"]
    assert [f[-1] for f in froms] == ["build", "runtime"]


def test_the_build_stage_makes_wheels_of_the_pinned_requirements():
    build = " ".join(arguments for kind, arguments in stages()[0] if kind == "RUN")
    assert "pip wheel --wheel-dir /wheels -r requirements.txt" in build
    runtime = " ".join(arguments for kind, arguments in stages()[1] if kind == "RUN")
    assert "pip install --no-index --find-links=/wheels -r /tmp/requirements.txt" in runtime
    assert "build-essential" not in runtime, "no compiler in the runtime"


def test_the_image_has_the_agents_nvml_binding_from_the_runtime_pins():
    """One image runs the node agent too: its NVML binding is a runtime pin, installed with the rest."""
    assert re.search(r"^nvidia-ml-py==[\d.]+", (ROOT / "requirements.txt").read_text(), re.MULTILINE)


def test_the_final_stage_runs_as_a_non_root_user():
    runtime = stages()[-1]
    users = [arguments for kind, arguments in runtime if kind == "USER"]
    assert users, "the runtime stage sets USER"
    user = users[-1].split(":")[0]
    assert user not in {"root", "0"} and user.isdigit(), "a numeric non-root user (Kubernetes' runAsNonRoot checks it)"
    assert "useradd --system --uid " + user in " ".join(a for k, a in runtime if k == "RUN")
    # The code is root's: the processes read it and cannot change it.
    for kind, arguments in runtime:
        if kind == "COPY":
            assert "--chown" not in arguments


def test_every_copy_source_exists_and_is_in_the_build_context():
    ignored = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")]
    copied = []
    for kind, arguments in instructions():
        if kind != "COPY":
            continue
        parts = shlex.split(arguments)
        if any(part.startswith("--from=") for part in parts):
            continue
        sources = [part for part in parts if not part.startswith("--")][:-1]
        for source in sources:
            assert (ROOT / source).exists(), f"COPY {source}: no such file"
            excluded = [p for p in ignored if not p.startswith("!")
                        and (fnmatch.fnmatch(source, p) or source.startswith(p.rstrip("/") + "/"))]
            assert not excluded, f"COPY {source} is left out of the build context by .dockerignore {excluded}"
            copied.append(source)
    # Every app of the floor plan is in the image (a new one forgotten here would fail at import).
    linter = configparser.ConfigParser()
    linter.read(ROOT / ".importlinter")
    packages = linter["importlinter"]["root_packages"].split()
    assert set(packages) <= set(copied), set(packages) - set(copied)
    assert {"manage.py", "templates", "deploy/entrypoint.sh", "deploy/gunicorn.conf.py"} <= set(copied)


def test_the_secret_key_is_throwaway_and_only_at_build():
    runtime_env = " ".join(a for k, a in stages()[-1] if k == "ENV")
    assert "MERIDIAN_LOG_FORMAT=json" in runtime_env, "containers log one JSON object a line"
    for kind, arguments in instructions():
        if kind == "ENV":
            assert "DJANGO_SECRET_KEY" not in arguments and "MERIDIAN_ENCRYPTION_KEYS" not in arguments
    collect = [a for k, a in stages()[-1] if k == "RUN" and "collectstatic" in a]
    assert len(collect) == 1 and "DJANGO_SECRET_KEY=collectstatic-build-only" in collect[0]


def test_collectstatic_runs_with_the_dockerfiles_build_environment(tmp_path):
    """The build's collectstatic step, here: its inline variables, into a scratch data folder."""
    command = [a for k, a in stages()[-1] if k == "RUN" and "collectstatic" in a][0].split("&&")[0]
    words = shlex.split(command)
    assignments = dict(word.split("=", 1) for word in words if re.match(r"^[A-Z_]+=", word))
    argv = [word for word in words if not re.match(r"^[A-Z_]+=", word)]
    assert argv[:3] == ["python", "manage.py", "collectstatic"]
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "DJANGO_SETTINGS_MODULE": "config.settings",
           "MERIDIAN_DATA_DIR": str(tmp_path / "data"), **assignments}
    subprocess.run([sys.executable, *argv[1:]], cwd=ROOT, env=env, check=True, timeout=300)
    data = tmp_path / "data"
    assert (data / "static" / "staticfiles.json").exists() or any((data / "static").iterdir())
    assert {path.name for path in data.iterdir()} == {"static"}, "the build leaves nothing else in the data folder"


def test_the_entrypoint_is_valid_bash_and_its_roles_are_documented():
    subprocess.run(["bash", "-n", str(ENTRYPOINT)], check=True)
    assert os.access(ENTRYPOINT, os.X_OK)
    entry = [a for k, a in instructions() if k == "ENTRYPOINT"]
    assert entry == ['["/app/deploy/entrypoint.sh"]']
    roles = entrypoint_roles()
    assert {"web", "worker", "beat", "scheduler", "agent", "migrate", "manage", "probe", "worker-ping"} <= roles
    shown = subprocess.run([str(ENTRYPOINT), "help"], env={**os.environ, "MERIDIAN_APP_DIR": str(ROOT)},
                           capture_output=True, text=True, check=True).stdout
    for role in roles - {"help | -h | --help"}:
        assert f"  {role}" in shown, role


def test_the_roles_commands_exist():
    from django.core.management import get_commands

    commands = get_commands()
    assert "run_scheduler" in commands and "migrate" in commands
    from config.celery import app  # what `celery -A config` loads

    assert "provisioning.operation_step" in app.tasks or app.autodiscover_tasks
    agent = subprocess.run([sys.executable, "-m", "provisioning.agent", "--help"], cwd=ROOT, capture_output=True,
                           text=True, timeout=120)
    assert agent.returncode == 0, agent.stderr
    assert "--key-id" in agent.stdout


def test_gunicorn_settings_load_and_mark_dead_workers(tmp_path, monkeypatch):
    from gunicorn.config import Config

    monkeypatch.setenv("GUNICORN_WORKERS", "3")
    monkeypatch.setenv("GUNICORN_THREADS", "8")
    config = Config()
    namespace = {"__file__": str(ROOT / "deploy" / "gunicorn.conf.py")}
    exec(compile((ROOT / "deploy" / "gunicorn.conf.py").read_text(), "gunicorn.conf.py", "exec"), namespace)  # noqa: S102
    for name, value in namespace.items():
        if name in config.settings:
            config.set(name, value)
    assert (config.workers, config.threads, config.worker_class_str) == (3, 8, "gthread")
    assert config.settings["logger_class"].get() == "config.access_log.AccessLogger"
    # A dead worker's live gauge file goes; another process's stays.
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    (tmp_path / "gauge_livesum_4242.db").write_bytes(b"")
    (tmp_path / "gauge_livesum_4343.db").write_bytes(b"")
    config.child_exit(None, type("Worker", (), {"pid": 4242})())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gauge_livesum_4343.db"]
    assert callable(multiprocess.mark_process_dead)


@pytest.fixture
def health_server():
    """A stand-in web process on a free port that records what the probe sent."""
    seen = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 -- http.server's name
            seen.append((self.path, self.headers["Host"], self.headers["X-Forwarded-Proto"]))
            self.send_response(200 if self.path == "/health/ready" else 503)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1], seen
    server.shutdown()
    server.server_close()


def test_the_probe_asks_as_an_allowed_host_over_https(health_server):
    port, seen = health_server
    env = {"PATH": os.environ["PATH"], "MERIDIAN_APP_DIR": str(ROOT), "MERIDIAN_PORT": str(port),
           "DJANGO_ALLOWED_HOSTS": ".meridian.example.com,localhost"}
    ready = subprocess.run([str(ENTRYPOINT), "probe", "/health/ready"], env=env, capture_output=True, timeout=30)
    live = subprocess.run([str(ENTRYPOINT), "probe", "/health/other"], env=env, capture_output=True, timeout=30)
    assert (ready.returncode, live.returncode) == (0, 1)
    assert seen[0] == ("/health/ready", "meridian.example.com", "https")
