#!/usr/bin/env bash
# The image's entrypoint: one image, the role chosen by the first argument.
#   web | worker | beat | scheduler | agent [ARGS] | migrate | manage ARGS | probe PATH | worker-ping | help
# Anything else is run as given (a shell for debugging: `docker run -it IMAGE bash`).
set -euo pipefail

APP_DIR=${MERIDIAN_APP_DIR:-/app}
cd "$APP_DIR"

log_level=${MERIDIAN_LOG_LEVEL:-INFO}

# prometheus_client's multiprocess folder holds one file per process id: it must start empty, before
# any process of this container writes to it (the container's pids restart from 1).
prepare_metrics_dir() {
  if [[ -n "${PROMETHEUS_MULTIPROC_DIR:-}" ]]; then
    mkdir -p "$PROMETHEUS_MULTIPROC_DIR"
    find "$PROMETHEUS_MULTIPROC_DIR" -mindepth 1 -maxdepth 1 -name '*.db' -delete
  fi
}

# The templates' placeholders (deploy/kubernetes/secret.yaml, .env.example) must never reach a
# running control plane: a known secret key would let anyone forge sessions.
refuse_placeholders() {
  local name value
  for name in DJANGO_SECRET_KEY MERIDIAN_ENCRYPTION_KEYS DATABASE_URL CELERY_BROKER_URL REDIS_URL; do
    value=${!name:-}
    if [[ "$value" == *REPLACE_ME* || "$value" == *change-me* ]]; then
      echo "$name still holds the template's placeholder: set a real value (docs/deployment.md)." >&2
      exit 64
    fi
  done
}

usage() {
  cat <<'USAGE'
Usage: entrypoint.sh ROLE [ARGS...]
  web            gunicorn serving the console and the APIs (deploy/gunicorn.conf.py)
  worker         a Celery worker (MERIDIAN_WORKER_CONCURRENCY processes, default 4)
  beat           Celery beat (periodic tasks; one leads, the others stand by)
  scheduler      manage.py run_scheduler (one leads, the others stand by)
  agent ARGS     a node agent: python -m provisioning.agent ARGS
  migrate        manage.py migrate --noinput (run once per release, before rolling the rest)
  manage ARGS    manage.py ARGS (e.g. createsuperuser, audit_verify, check --deploy)
  probe PATH     exit 0 if GET http://127.0.0.1:$MERIDIAN_PORT/PATH answers 2xx (health checks)
  worker-ping    exit 0 if this container's Celery worker answers a ping (health checks)
USAGE
}

role=${1:-help}
[[ $# -gt 0 ]] && shift
case "$role" in
  web | worker | beat | scheduler | migrate) refuse_placeholders ;;
esac

case "$role" in
  web)
    prepare_metrics_dir
    exec gunicorn config.wsgi:application --config "$APP_DIR/deploy/gunicorn.conf.py" "$@"
    ;;
  worker)
    prepare_metrics_dir
    exec celery -A config worker --hostname "worker@%h" --concurrency "${MERIDIAN_WORKER_CONCURRENCY:-4}" \
      --without-mingle --without-gossip --loglevel "$log_level" "$@"
    ;;
  beat)
    # The schedule lives in the database (django_celery_beat); no state file is written.
    exec celery -A config beat --loglevel "$log_level" "$@"
    ;;
  scheduler)
    exec python manage.py run_scheduler "$@"
    ;;
  agent)
    exec python -m provisioning.agent "$@"
    ;;
  migrate)
    exec python manage.py migrate --noinput "$@"
    ;;
  manage)
    exec python manage.py "$@"
    ;;
  probe)
    # No curl in the slim image. The Host header is the first allowed host, and X-Forwarded-Proto
    # says https: gunicorn trusts it from 127.0.0.1, so the HTTPS redirect does not answer the probe.
    exec python - "${1:?probe needs a path, e.g. /health/ready}" <<'PY'
import os
import sys
import urllib.request

port = os.environ.get("MERIDIAN_PORT", "8000")
host = os.environ.get("DJANGO_ALLOWED_HOSTS", "localhost").split(",")[0].strip().lstrip(".")
host = host if host and host != "*" else "localhost"
request = urllib.request.Request(f"http://127.0.0.1:{port}{sys.argv[1]}",
                                 headers={"Host": host, "X-Forwarded-Proto": "https"})
try:
    with urllib.request.urlopen(request, timeout=float(os.environ.get("MERIDIAN_PROBE_TIMEOUT", "5"))) as answer:
        sys.exit(0 if 200 <= answer.status < 300 else 1)
except Exception as error:  # noqa: BLE001 -- any failure is an unhealthy answer
    print(f"probe {sys.argv[1]}: {error}", file=sys.stderr)
    sys.exit(1)
PY
    ;;
  worker-ping)
    exec celery -A config inspect ping --destination "worker@$(hostname)" --timeout "${MERIDIAN_PING_TIMEOUT:-10}"
    ;;
  help | -h | --help)
    usage
    ;;
  *)
    exec "$role" "$@"
    ;;
esac
