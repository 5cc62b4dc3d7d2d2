# syntax=docker/dockerfile:1
# Meridian's one image: web, worker, beat, scheduler and node agent, chosen by the command
# (deploy/entrypoint.sh: web | worker | beat | scheduler | agent | migrate | manage ...).
# Build:  docker build -t meridian:$(git rev-parse --short HEAD) .
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# --- build: wheels of every pinned dependency, compiled here so the runtime needs no compiler ---
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY requirements.txt ./
RUN pip wheel --wheel-dir /wheels -r requirements.txt

# --- runtime: the interpreter, the installed wheels, the code and the collected static files ---
FROM ${PYTHON_IMAGE} AS runtime
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    DJANGO_SETTINGS_MODULE=config.settings \
    MERIDIAN_APP_DIR=/app \
    MERIDIAN_DATA_DIR=/var/lib/meridian \
    MERIDIAN_AUDIT_HEAD_DIR=/var/lib/meridian/audit-heads \
    MERIDIAN_BALANCER_CONFIG=/var/lib/meridian/balancer/haproxy.cfg \
    MERIDIAN_PORT=8000 \
    MERIDIAN_LOG_FORMAT=json
RUN groupadd --system --gid 10001 meridian \
 && useradd --system --uid 10001 --gid meridian --home-dir /nonexistent --no-create-home \
      --shell /usr/sbin/nologin meridian
COPY requirements.txt /tmp/requirements.txt
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    python -m venv /opt/venv \
 && pip install --no-index --find-links=/wheels -r /tmp/requirements.txt \
 && rm /tmp/requirements.txt
WORKDIR /app
# The code belongs to root: the processes (user meridian) can read it, never change it.
COPY manage.py ./
COPY config ./config
COPY core ./core
COPY tenants ./tenants
COPY security ./security
COPY web ./web
COPY cloud ./cloud
COPY provisioning ./provisioning
COPY storage ./storage
COPY billing ./billing
COPY webhooks ./webhooks
COPY inference ./inference
COPY operations ./operations
COPY templates ./templates
COPY deploy/entrypoint.sh deploy/gunicorn.conf.py ./deploy/
# Static files are collected into the image (whitenoise serves them). Settings need a secret key
# and encryption keys outside the embedded mode: throwaway ones, for this step only; nothing
# touches the database, and the broker URL keeps the file-system broker's folders out of the image.
RUN DJANGO_SECRET_KEY=collectstatic-build-only-not-a-secret \
    MERIDIAN_ENCRYPTION_KEYS=Y29sbGVjdHN0YXRpYy1idWlsZC1vbmx5LWtleS0wMDA= \
    DATABASE_URL=postgres://build@127.0.0.1:1/unused \
    CELERY_BROKER_URL=memory:// \
    python manage.py collectstatic --noinput --verbosity 0 \
 && install -d -o meridian -g meridian -m 0750 /var/lib/meridian/audit-heads /var/lib/meridian/metrics \
      /var/lib/meridian/balancer
USER 10001:10001
EXPOSE 8000
ENTRYPOINT ["/app/deploy/entrypoint.sh"]
CMD ["help"]
