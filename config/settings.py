"""
Meridian settings: one module, every value from the environment.

With nothing set, Meridian runs on its embedded default: SQLite in IMMEDIATE transaction mode
and a file-system Celery broker, both under the data folder (``var/``), and simulated drivers.
Production sets DATABASE_URL (PostgreSQL), CELERY_BROKER_URL (RabbitMQ), REDIS_URL,
DJANGO_SECRET_KEY, DJANGO_ALLOWED_HOSTS and MERIDIAN_ENCRYPTION_KEYS.
See https://docs.djangoproject.com/en/5.2/ref/settings/
"""

import os
import secrets
from datetime import timedelta
from pathlib import Path

import environ
from cryptography.fernet import Fernet
from csp.constants import NONE, SELF
from django.core.exceptions import ImproperlyConfigured

from config.logging_json import log_format, logging_settings

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()


def _file_secret(path: Path, make) -> str:
    """
    A secret kept in the data folder, created on first use -- for the embedded default only:
    several machines sharing one database must share their keys, so there the environment
    must set them (see EMBEDDED below).
    """
    if not EMBEDDED:
        raise ImproperlyConfigured(
            f"{path.name} must come from the environment when DATABASE_URL is not the embedded SQLite "
            "(set DJANGO_SECRET_KEY and MERIDIAN_ENCRYPTION_KEYS the same on every machine)."
        )
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as secret_file:
            secret_file.write(make())
    return path.read_text().strip()


#
# Core
#
DATA_DIR = Path(env("MERIDIAN_DATA_DIR", default=str(BASE_DIR / "var"))).resolve()
# Embedded mode: one machine, SQLite in the data folder. Anything else is a deployment.
EMBEDDED = env("DATABASE_URL", default="sqlite:").startswith("sqlite:")
DEBUG = env.bool("DJANGO_DEBUG", default=False)
SECRET_KEY = env("DJANGO_SECRET_KEY", default=None) or _file_secret(
    DATA_DIR / "secret_key", lambda: secrets.token_urlsafe(64)
)
ALLOWED_HOSTS = env.list("DJANGO_ALLOWED_HOSTS", default=["127.0.0.1", "localhost"])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "django.contrib.humanize",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "drf_standardized_errors",
    "django_celery_beat",
    "axes",
    "csp",
    "django_htmx",
    # Request metrics for /metrics (operations.metrics_views); its middlewares open and close MIDDLEWARE.
    "django_prometheus",
    # Meridian's apps, bottom to top (docs/architecture.md); config last: it composes them.
    "tenants",
    "security",
    "web",
    "cloud",
    "provisioning",
    "storage",
    "billing",
    "webhooks",
    "inference",
    "operations",
    "config",
]

MIDDLEWARE = [
    # First, as django-prometheus asks: its latency includes every other middleware.
    "django_prometheus.middleware.PrometheusBeforeMiddleware",
    "core.middleware.RequestIdMiddleware",
    "core.middleware.BodySizeLimitMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "csp.middleware.CSPMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    # django-prometheus wants this one last; it sits just inside axes (which must be last), so the
    # status it counts is the one sent, a lockout included.
    "django_prometheus.middleware.PrometheusAfterMiddleware",
    # Last, as django-axes asks: it turns a lockout raised by the auth backend into a response.
    "axes.middleware.AxesMiddleware",
]

# The node API's own chain (operations.node_api.handler): what an agent's signed JSON request
# needs, in MIDDLEWARE's order.
MERIDIAN_NODE_API_MIDDLEWARE = [
    "django_prometheus.middleware.PrometheusBeforeMiddleware",
    "core.middleware.RequestIdMiddleware",
    "core.middleware.BodySizeLimitMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "django.middleware.common.CommonMiddleware",  # ALLOWED_HOSTS: the signature does not cover Host
    "django_prometheus.middleware.PrometheusAfterMiddleware",
]

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = "config.wsgi.application"
AUTH_USER_MODEL = "tenants.User"
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "home"
LOGOUT_REDIRECT_URL = "login"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "web.console.context",
            ],
        },
    },
]

#
# Database
# https://docs.djangoproject.com/en/5.2/ref/databases/#sqlite-transaction-behavior
#
DATABASES = {"default": env.db("DATABASE_URL", default=f"sqlite:///{DATA_DIR / 'meridian.sqlite3'}")}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # IMMEDIATE takes the write lock at BEGIN, so read-then-write transactions never deadlock
    # ("database is locked"); every write transaction is serialised, which is the SQLite
    # counterpart of PostgreSQL's constraints and row locks.
    DATABASES["default"]["OPTIONS"] = {
        "transaction_mode": "IMMEDIATE",
        "timeout": 20,
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
else:
    # Keep connections between requests (each gunicorn thread holds one), checked before reuse.
    DATABASES["default"].setdefault("CONN_MAX_AGE", env.int("DJANGO_CONN_MAX_AGE", default=60))
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
    # The node API's hot statements and the fast path's read of a few nodes are prepared on the
    # server (core.db.fast_cursor); behind a transaction-mode pooler (PgBouncer), which
    # cannot keep them, turn that off.
    if not env.bool("MERIDIAN_DB_PREPARED_STATEMENTS", default=True):
        DATABASES["default"].setdefault("OPTIONS", {})["prepare_threshold"] = None
    else:
        # Prepared, they are planned once, for any values: PostgreSQL's default would keep planning
        # the read of a few nodes for the values at hand on every create (its generic plan looks
        # dearer to it), 3.6 ms where the generic plan runs in 1.2. Only the prepared statements
        # (fast_cursor's) follow this; Django's own cursors never prepare.
        DATABASES["default"].setdefault("OPTIONS", {}).setdefault("options", "-c plan_cache_mode=force_generic_plan")
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

#
# Cache (throttles, the auth epoch, the scheduler's last cycle). Redis in production; a file cache in
# embedded mode.
#
REDIS_URL = env("REDIS_URL", default="")
CACHES = {
    "default": (
        {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": REDIS_URL}
        if REDIS_URL
        # Embedded: a file cache, so the web, worker and scheduler processes share it (throttles,
        # the scheduler's last cycle) as they share Redis in a deployment; its counters are atomic
        # across them as Redis's INCR is (cloud/file_cache.py).
        else {"BACKEND": "core.file_cache.AtomicFileCache", "LOCATION": str(DATA_DIR / "cache")}
    )
}

#
# Passwords and login
# https://docs.djangoproject.com/en/5.2/topics/auth/passwords/
#
PASSWORD_HASHERS = [
    "django.contrib.auth.hashers.Argon2PasswordHasher",
    "django.contrib.auth.hashers.PBKDF2PasswordHasher",
]
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator", "OPTIONS": {"min_length": 10}},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
# https://django-axes.readthedocs.io/en/latest/4_configuration.html
# Five wrong passwords are answered with the form; the sixth locks username+address (axes locks
# on the attempt that reaches the limit).
AXES_FAILURE_LIMIT = env.int("MERIDIAN_LOGIN_FAILURE_LIMIT", default=5) + 1
AXES_COOLOFF_TIME = timedelta(minutes=env.int("MERIDIAN_LOGIN_COOLOFF_MINUTES", default=15))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
# The sign-in form's field is "username" (it holds the e-mail); axes would otherwise look for "email".
AXES_USERNAME_FORM_FIELD = "username"
# Failures count per address however it is spelt, as sign-in matches it (strip, any case).
AXES_USERNAME_CALLABLE = "tenants.authentication.login_username"
AXES_RESET_ON_SUCCESS = True
# Not verbose: axes would log its start-up banner (at INFO, to stderr) in every process, every
# management command included, where stderr is kept for real problems. Lockouts are still logged.
AXES_VERBOSE = False

#
# Deploy-time security: on whenever DEBUG is off, so `check --deploy` is clean with just a
# real secret key and allowed hosts. The local run command serves plain HTTP on loopback and
# turns the HTTPS-only parts off with MERIDIAN_SECURE_TRANSPORT=0 (DEBUG stays off).
#
SECURE_TRANSPORT = env.bool("MERIDIAN_SECURE_TRANSPORT", default=not DEBUG)
SECURE_SSL_REDIRECT = SECURE_TRANSPORT
# Orchestrators probe each process directly over plain HTTP, inside the cluster.
SECURE_REDIRECT_EXEMPT = [r"^health/"]
SESSION_COOKIE_SECURE = SECURE_TRANSPORT
CSRF_COOKIE_SECURE = SECURE_TRANSPORT
SECURE_HSTS_SECONDS = 31_536_000 if SECURE_TRANSPORT else 0
SECURE_HSTS_INCLUDE_SUBDOMAINS = SECURE_TRANSPORT
SECURE_HSTS_PRELOAD = SECURE_TRANSPORT
if env.bool("MERIDIAN_BEHIND_TLS_PROXY", default=False):
    # Only behind a proxy that always sets this header; otherwise a client could fake HTTPS.
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
CSRF_TRUSTED_ORIGINS = env.list("DJANGO_CSRF_TRUSTED_ORIGINS", default=[])
# Bodies above this are refused with 413 before anything parses them (core.middleware).
DATA_UPLOAD_MAX_MEMORY_SIZE = 1_000_000

# https://django-csp.readthedocs.io/en/latest/configuration.html
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF],
        # Swagger UI sets style attributes from script.
        "style-src": [SELF, "'unsafe-inline'"],
        "img-src": [SELF, "data:"],
        "connect-src": [SELF],
        "object-src": [NONE],
        "base-uri": [SELF],
        "form-action": [SELF],
        "frame-ancestors": [NONE],
    }
}

#
# Internationalisation and static files
#
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
STATIC_ROOT = DATA_DIR / "static"
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}

#
# REST API
# https://www.django-rest-framework.org/api-guide/settings/
#
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "tenants.authentication.APITokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PARSER_CLASSES": ["web.api.parsers.StrictJSONParser"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PAGINATION_CLASS": "web.api.pagination.Pagination",
    "PAGE_SIZE": 50,
    "DEFAULT_FILTER_BACKENDS": [
        "django_filters.rest_framework.DjangoFilterBackend",
        "rest_framework.filters.OrderingFilter",
    ],
    "DEFAULT_THROTTLE_CLASSES": ["web.api.throttling.PrincipalRateThrottle"],
    "DEFAULT_THROTTLE_RATES": {
        "principal": env("MERIDIAN_API_RATE", default="1200/min"),
        "anonymous": env("MERIDIAN_API_ANON_RATE", default="120/min"),
    },
    "DEFAULT_SCHEMA_CLASS": "drf_standardized_errors.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "drf_standardized_errors.handler.exception_handler",
    "TEST_REQUEST_DEFAULT_FORMAT": "json",
    # Proxies in front whose X-Forwarded-For may be trusted for per-address limits; 0 trusts none.
    "NUM_PROXIES": env.int("MERIDIAN_TRUSTED_PROXIES", default=0),
}
DRF_STANDARDIZED_ERRORS = {
    "ENABLE_IN_DEBUG_FOR_UNHANDLED_EXCEPTIONS": True,
    "EXCEPTION_HANDLER_CLASS": "web.api.errors.ExceptionHandler",
    "EXCEPTION_FORMATTER_CLASS": "web.api.errors.ExceptionFormatter",
}

# https://drf-spectacular.readthedocs.io/en/latest/settings.html
SPECTACULAR_SETTINGS = {
    "TITLE": "Meridian API",
    "DESCRIPTION": (
        "Control plane of a multi-tenant GPU cloud. Authenticate with `Authorization: Bearer mrd_...`; "
        "a session call picks its tenant with the `X-Meridian-Tenant` header. Every 4xx has one JSON shape: "
        '`{"type": ..., "errors": [{"code", "detail", "attr"}]}`.'
    ),
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SCHEMA_PATH_PREFIX": r"/api/v1",
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    "ENUM_NAME_OVERRIDES": {
        "ValidationErrorEnum": "drf_standardized_errors.openapi_serializers.ValidationErrorEnum.choices",
        "ClientErrorEnum": "drf_standardized_errors.openapi_serializers.ClientErrorEnum.choices",
        "ServerErrorEnum": "drf_standardized_errors.openapi_serializers.ServerErrorEnum.choices",
        "ErrorCode401Enum": "drf_standardized_errors.openapi_serializers.ErrorCode401Enum.choices",
        "ErrorCode403Enum": "drf_standardized_errors.openapi_serializers.ErrorCode403Enum.choices",
        "ErrorCode404Enum": "drf_standardized_errors.openapi_serializers.ErrorCode404Enum.choices",
        "ErrorCode405Enum": "drf_standardized_errors.openapi_serializers.ErrorCode405Enum.choices",
        "ErrorCode406Enum": "drf_standardized_errors.openapi_serializers.ErrorCode406Enum.choices",
        "ErrorCode415Enum": "drf_standardized_errors.openapi_serializers.ErrorCode415Enum.choices",
        "ErrorCode429Enum": "drf_standardized_errors.openapi_serializers.ErrorCode429Enum.choices",
        "ErrorCode500Enum": "drf_standardized_errors.openapi_serializers.ErrorCode500Enum.choices",
        "TenantRoleEnum": "tenants.choices.TenantRole.choices",
        "TeamRoleEnum": "tenants.choices.TeamRole.choices",
        "NodeStateEnum": "cloud.choices.NodeState.choices",
        "OfferingKindEnum": "cloud.choices.OfferingKind.choices",
        "OperationKindEnum": "provisioning.choices.OperationKind.choices",
        "ReservationStateEnum": "provisioning.choices.ReservationState.choices",
        "OperationStateEnum": "provisioning.choices.OperationState.choices",
        "GPUStateEnum": "cloud.choices.GPUState.choices",
        "TrustAnchorKindEnum": "security.choices.TrustAnchorKind.choices",
        "HighPriorityStateEnum": "tenants.models.HighPriorityState.choices",
        "VolumeStateEnum": "storage.choices.VolumeState.choices",
        "CheckpointStateEnum": "storage.choices.CheckpointState.choices",
        "BillingTermEnum": "provisioning.choices.BillingTerm.choices",
    },
    "POSTPROCESSING_HOOKS": ["drf_standardized_errors.openapi_hooks.postprocess_schema_enums"],
}

#
# Celery
# https://docs.celeryq.dev/en/stable/userguide/configuration.html
#
CELERY_BROKER_URL = env("CELERY_BROKER_URL", default="filesystem://")
if CELERY_BROKER_URL.startswith("filesystem://"):
    _broker = DATA_DIR / "broker"
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_broker / "queue"),
        "data_folder_out": str(_broker / "queue"),
        "control_folder": str(_broker / "control"),
        "polling_interval": 0.1,
    }
    for _folder in ("queue", "control"):
        (_broker / _folder).mkdir(parents=True, exist_ok=True)
else:
    # py-amqp publisher confirms: a publish returns only once RabbitMQ has the message.
    CELERY_BROKER_TRANSPORT_OPTIONS = {"confirm_publish": True}
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_IGNORE_RESULT = True
# Below RabbitMQ's 30-minute consumer_timeout; lifecycle work is a chain of short steps.
CELERY_TASK_TIME_LIMIT = 10 * 60
CELERY_TASK_SOFT_TIME_LIMIT = 9 * 60
CELERY_WORKER_SOFT_SHUTDOWN_TIMEOUT = 10
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TASK_DEFAULT_QUEUE = env("MERIDIAN_CELERY_QUEUE", default="meridian")
CELERY_TIMEZONE = "UTC"
# django_celery_beat's database scheduler, with standbys: one beat leads (config/beat.py).
CELERY_BEAT_SCHEDULER = "config.beat:LeaderScheduler"
# How often a standby beat asks for the lead: a killed leader's tasks resume within about this.
MERIDIAN_BEAT_STANDBY_POLL = env.float("MERIDIAN_BEAT_STANDBY_SECONDS", default=1.0)
# What beat sends, and how often: config/beat_schedule.py.
from config.beat_schedule import CELERY_BEAT_SCHEDULE  # noqa: E402, F401

#
# Meridian
#
# Fernet keys for secrets at rest, newest first; older keys still decrypt (rotation).
MERIDIAN_ENCRYPTION_KEYS = env.list("MERIDIAN_ENCRYPTION_KEYS", default=[]) or [
    _file_secret(DATA_DIR / "encryption_key", lambda: Fernet.generate_key().decode())
]
# The audit chain's signed heads are published here as well as in the database (one JSON line per
# checkpoint, security/audit_heads.py), so deleting the newest events with their checkpoints is
# still found. Keep it where the database's writer cannot rewrite it; audit_verify reads it back.
MERIDIAN_AUDIT_HEAD_DIR = env("MERIDIAN_AUDIT_HEAD_DIR", default=str(DATA_DIR / "audit-heads"))
# Also send each head to syslog: "/dev/log" or "host:port" (UDP).
MERIDIAN_AUDIT_HEAD_SYSLOG = env("MERIDIAN_AUDIT_HEAD_SYSLOG", default="")
# API tokens never live longer than this; a token without an expiry is allowed.
MERIDIAN_TOKEN_MAX_TTL = timedelta(days=env.int("MERIDIAN_TOKEN_MAX_TTL_DAYS", default=365))
# How long a process reuses what a token resolved to (its user, roles: tenants/token_cache.py)
# while no token, user, membership or team changed anywhere; the longest a change the cache was
# not told of (a hand-written UPDATE) goes unseen. 0: every request reads the database.
MERIDIAN_AUTH_CACHE_SECONDS = env.float("MERIDIAN_AUTH_CACHE_SECONDS", default=10.0)
# Likewise the offerings and regions a create names by slug (cloud/catalogue_cache.py), while no
# offering, region or GPU model changed. 0: every create reads them.
MERIDIAN_CATALOGUE_CACHE_SECONDS = env.float("MERIDIAN_CATALOGUE_CACHE_SECONDS", default=30.0)
# And the quota limits a create is checked against (tenants/quotas.py), while no quota row changed.
MERIDIAN_QUOTA_CACHE_SECONDS = env.float("MERIDIAN_QUOTA_CACHE_SECONDS", default=30.0)
MERIDIAN_INVITATION_TTL = timedelta(days=env.int("MERIDIAN_INVITATION_TTL_DAYS", default=7))
# Limits when no Quota row exists for a tenant (teams without a row share their tenant's).
MERIDIAN_DEFAULT_QUOTAS = {
    "gpus": env.int("MERIDIAN_DEFAULT_GPU_QUOTA", default=64),
    "vpcs": env.int("MERIDIAN_DEFAULT_VPC_QUOTA", default=10),
    "instances": env.int("MERIDIAN_DEFAULT_INSTANCE_QUOTA", default=32),
    "storage_gib": env.int("MERIDIAN_DEFAULT_STORAGE_QUOTA_GIB", default=102_400),
    # Per kind of storage class: within the overall storage limit unless set lower.
    "block_gib": env.int("MERIDIAN_DEFAULT_BLOCK_QUOTA_GIB", default=102_400),
    "shared_fs_gib": env.int("MERIDIAN_DEFAULT_SHARED_FS_QUOTA_GIB", default=102_400),
    "object_gib": env.int("MERIDIAN_DEFAULT_OBJECT_QUOTA_GIB", default=102_400),
}
MERIDIAN_PUBLIC_URL = env("MERIDIAN_PUBLIC_URL", default="http://127.0.0.1:8000")

# Outgoing e-mail (incident pages, staff notices) and on-call paging: docs/incidents.md.
EMAIL_BACKEND = env("EMAIL_BACKEND", default="django.core.mail.backends.smtp.EmailBackend")
EMAIL_HOST, EMAIL_PORT = env("EMAIL_HOST", default="localhost"), env.int("EMAIL_PORT", default=25)
EMAIL_HOST_USER, EMAIL_HOST_PASSWORD = env("EMAIL_HOST_USER", default=""), env("EMAIL_HOST_PASSWORD", default="")
EMAIL_USE_TLS, EMAIL_USE_SSL = env.bool("EMAIL_USE_TLS", default=False), env.bool("EMAIL_USE_SSL", default=False)
EMAIL_TIMEOUT = env.float("EMAIL_TIMEOUT", default=10.0)
DEFAULT_FROM_EMAIL = env("DEFAULT_FROM_EMAIL", default="meridian@localhost")
MERIDIAN_ONCALL_EMAIL = env.list("MERIDIAN_ONCALL_EMAIL", default=[])  # empty: no e-mail is sent
MERIDIAN_ONCALL_WEBHOOK_URL = env("MERIDIAN_ONCALL_WEBHOOK_URL", default="")  # empty: no webhook
MERIDIAN_ONCALL_WEBHOOK_SECRET = env("MERIDIAN_ONCALL_WEBHOOK_SECRET", default="")  # signs it when set
MERIDIAN_ONCALL_MIN_SEVERITY = env("MERIDIAN_ONCALL_MIN_SEVERITY", default="info")  # e-mail from here up
MERIDIAN_ONCALL_PAGE_SEVERITY = env("MERIDIAN_ONCALL_PAGE_SEVERITY", default="critical")  # the webhook too
MERIDIAN_ONCALL_SEVERITIES = env.json("MERIDIAN_ONCALL_SEVERITIES", default={})  # {"kind": "critical"}
MERIDIAN_ONCALL_MAX_ATTEMPTS = env.int("MERIDIAN_ONCALL_MAX_ATTEMPTS", default=8)
MERIDIAN_ONCALL_RETRY_SECONDS = env.float("MERIDIAN_ONCALL_RETRY_SECONDS", default=30.0)  # doubling, 1 h at most

# Reservations and the scheduler (read at call time).
# Priority weights: the operator's base formula 0.4 urgency + 0.3 fulfilment + 0.3 (1 - load),
# plus age, high-priority and fair-share terms (provisioning.scheduling.priority.Weights documents each).
MERIDIAN_PRIORITY_WEIGHTS = env.json("MERIDIAN_PRIORITY_WEIGHTS", default={})
# High-priority teams: what a team's record must show to apply and keep the status (keys of
# provisioning.scheduling.priority.HPThresholds: min_fulfilment 0.95, max_avg_release_delay_s 300,
# max_unplanned_changes 2; missing keys keep those defaults), and how long an approval lasts.
MERIDIAN_HP_THRESHOLDS = env.json("MERIDIAN_HP_THRESHOLDS", default={})
MERIDIAN_HP_VALIDITY_DAYS = env.int("MERIDIAN_HP_VALIDITY_DAYS", default=90)
MERIDIAN_MAX_RESERVATION_DURATION = timedelta(days=env.int("MERIDIAN_MAX_RESERVATION_DAYS", default=30))
# How far ahead an advance reservation may start.
MERIDIAN_MAX_ADVANCE = timedelta(days=env.int("MERIDIAN_MAX_ADVANCE_DAYS", default=90))
# Clock skew tolerated on a requested start in the past.
MERIDIAN_START_SKEW = timedelta(seconds=env.int("MERIDIAN_START_SKEW_SECONDS", default=60))
MERIDIAN_SPOT_GRACE = timedelta(seconds=env.int("MERIDIAN_SPOT_GRACE_SECONDS", default=120))
# How long before an active reservation's end its team is told it ends soon (provisioning.notices,
# once per reservation and end, by the lifecycle tick).
MERIDIAN_RESERVATION_ENDING_NOTICE = timedelta(minutes=env.int("MERIDIAN_RESERVATION_ENDING_NOTICE_MINUTES",
                                                               default=30))
# Share of each region's GPUs of a model (per pool) kept free for on-demand bursts: reserved work
# may not use it until it has waited MERIDIAN_HEADROOM_MAX_WAIT, spot work only with
# MERIDIAN_SPOT_IN_HEADROOM.
MERIDIAN_HEADROOM = env.float("MERIDIAN_HEADROOM", default=0.10)
# Reserved work that has waited this long for the headroom may use it (0: never): a headroom that
# on-demand work keeps full holds reserved work back an hour, not for ever (docs/scheduling.md).
MERIDIAN_HEADROOM_MAX_WAIT = timedelta(seconds=env.int("MERIDIAN_HEADROOM_MAX_WAIT_SECONDS", default=3600))
# Spot work may use the headroom and gives it back by soft eviction to on-demand work ranked above
# it (docs/scheduling.md); off keeps spot work out of it like reserved work (docs/benchmarks.md).
MERIDIAN_SPOT_IN_HEADROOM = env.bool("MERIDIAN_SPOT_IN_HEADROOM", default=True)
# How long the fast path trusts the nodes a recent read of a pool chose (provisioning/free_hint.py):
# creates within it count only those nodes' free GPUs again, not the whole pool's. 0 turns it off.
MERIDIAN_FAST_PATH_HINT_SECONDS = env.float("MERIDIAN_FAST_PATH_HINT_SECONDS", default=2.0)
# How long the process's start sender (provisioning/start_sender.py) waits for more starts before
# it publishes: those placed within it share a message. 0 sends each as it comes.
MERIDIAN_START_LINGER_MS = env.float("MERIDIAN_START_LINGER_MS", default=50.0)
MERIDIAN_SCHEDULER_INTERVAL = env.float("MERIDIAN_SCHEDULER_INTERVAL_SECONDS", default=0.5)
# How many of the ranked queue one cycle tries to place (Slurm's default_queue_depth): the whole
# queue is ranked (every cycle, or every MERIDIAN_SCHEDULER_RERANK_SECONDS while cycles are cut
# short), but planning stops here so a cycle stays short; the rest waits.
MERIDIAN_SCHEDULER_QUEUE_DEPTH = env.int("MERIDIAN_SCHEDULER_QUEUE_DEPTH", default=1000)
# How many placements one cycle commits at most: a cycle on an empty fleet would otherwise
# commit a thousand at once and not see a cancellation or an urgent arrival for seconds.
MERIDIAN_SCHEDULER_MAX_PLACEMENTS = env.int("MERIDIAN_SCHEDULER_MAX_PLACEMENTS", default=400)
# How long one cycle of the scheduler loop should take, in milliseconds (0: no limit but the
# one above), like Slurm's max_sched_time: the loop plans only as many placements as it can
# commit in the time left, from what the last cycles took, and stops committing between batches
# of 100 when it runs slower than that (the rest stays queued for the next cycle). A short cycle
# sees a cancellation or an urgent arrival sooner; a long one spreads its fixed costs (ranking
# the whole queue, the snapshot) over more placements.
MERIDIAN_SCHEDULER_CYCLE_BUDGET_MS = env.float("MERIDIAN_SCHEDULER_CYCLE_BUDGET_MS", default=250.0)
# The least share of a cycle spent placing (committing) when ranking, the snapshot and planning
# alone fill the budget (a slow host, a large fleet): the cycle then runs over the budget rather
# than placing a handful. 0: the budget holds and the floor of 25 placements is all that moves
# (at most 0.9: placing cannot be the whole cycle).
MERIDIAN_SCHEDULER_PLACING_SHARE = env.float("MERIDIAN_SCHEDULER_PLACING_SHARE", default=0.4)
# How long the cycles after one cut short by its budget plan from the rest of its ranking before
# the queue is read and ranked again (scheduler.LoopMemory): work that joins a busy queue is
# ranked at most this much later. 0: every cycle ranks the whole queue.
MERIDIAN_SCHEDULER_RERANK = env.float("MERIDIAN_SCHEDULER_RERANK_SECONDS", default=1.0)
# Allocations that ended longer ago than this leave the no-overlap constraint (the lifecycle tick
# archives them; their rows stay as history), whose index would otherwise grow with every
# release and slow each placement. Nothing is bound to start more than half of it ago (a plan
# that old is re-planned), which leaves the other half for clock skew between the processes that
# allocate and the one that archives: keep it well above the skew NTP allows.
if "MERIDIAN_ALLOCATION_ARCHIVE_AFTER_MINUTES" in os.environ:
    raise ImproperlyConfigured("MERIDIAN_ALLOCATION_ARCHIVE_AFTER_MINUTES is now "
                               "MERIDIAN_ALLOCATION_ARCHIVE_AFTER_SECONDS (default 20): set that one instead.")
_archive_after_s = env.float("MERIDIAN_ALLOCATION_ARCHIVE_AFTER_SECONDS", default=20.0)
if _archive_after_s < 10:
    raise ImproperlyConfigured("MERIDIAN_ALLOCATION_ARCHIVE_AFTER_SECONDS must be at least 10: a create or a "
                               "scheduler cycle may take a few seconds from its plan to its commit.")
MERIDIAN_ALLOCATION_ARCHIVE_AFTER = timedelta(seconds=_archive_after_s)
# How long the scheduler loop reuses the teams' records (fulfilment, load, usage) between
# cycles, like Slurm's PriorityCalcPeriod; the age term and urgency are fresh every cycle.
MERIDIAN_SCHEDULER_RECORD_REFRESH = env.float("MERIDIAN_SCHEDULER_RECORD_REFRESH_SECONDS", default=5.0)
# How long it reuses the teams' decayed usage (fair share): summing every allocation of the last
# weeks is the costliest part of a record and, with a half-life of days, moves least. Slurm
# recalculates its decayed usage every PriorityCalcPeriod, 5 minutes by default.
MERIDIAN_SCHEDULER_USAGE_REFRESH = env.float("MERIDIAN_SCHEDULER_USAGE_REFRESH_SECONDS", default=300.0)
# How long the loop reuses the fleet's shape (which GPU sits on which node, leaf, fabric; read
# again at once when nodes or GPUs are added or removed). What may take work is read every cycle.
MERIDIAN_SCHEDULER_SHAPE_REFRESH = env.float("MERIDIAN_SCHEDULER_SHAPE_REFRESH_SECONDS", default=30.0)
# How long the loop keeps its planning index, catching up each cycle with the nodes whose
# allocations changed, before building it again (provisioning.scheduling.kept_capacity); 0: every cycle.
MERIDIAN_SCHEDULER_INDEX_REBUILD = env.float("MERIDIAN_SCHEDULER_INDEX_REBUILD_SECONDS", default=300.0)

# Where the inference endpoints' load balancer configuration is written (inference.balancer).
MERIDIAN_BALANCER_CONFIG = env("MERIDIAN_BALANCER_CONFIG", default=str(DATA_DIR / "balancer" / "haproxy.cfg"))
# The fleet's settings (drivers, images, steps, detection, replacement, SLA, alerts): config.fleet_settings.
from config.fleet_settings import *  # noqa: E402, F403

# An operation untouched this long lost its worker without a redelivery: the reaper resumes it
# (MERIDIAN_RESUME_LIMIT). Longer than a task may run, so a slow step still running is never
# started a second time beside itself.
MERIDIAN_STUCK_AFTER = timedelta(seconds=max(env.int("MERIDIAN_STUCK_AFTER_SECONDS", default=0),
                                             CELERY_TASK_TIME_LIMIT + 60))

# plain (default: `make run`) or json (deployments; the image sets it), with the request id, tenant,
# task and trace on each line: config.logging_json, docs/observability.md.
MERIDIAN_LOG_FORMAT = log_format()
LOGGING = logging_settings(MERIDIAN_LOG_FORMAT, level=env("MERIDIAN_LOG_LEVEL", default="INFO"))
if MERIDIAN_AUDIT_HEAD_SYSLOG:
    _host, _, _port = MERIDIAN_AUDIT_HEAD_SYSLOG.rpartition(":")
    LOGGING["handlers"]["audit_head_syslog"] = {
        "class": "logging.handlers.SysLogHandler",
        "address": (_host, int(_port)) if _host and _port.isdigit() else MERIDIAN_AUDIT_HEAD_SYSLOG,
    }
    LOGGING["loggers"]["meridian.audit.head"] = {"handlers": ["audit_head_syslog"], "level": "INFO"}
