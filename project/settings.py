"""Django settings: everything that varies comes from the environment (see .env.example).

Unset variables select the embedded default: SQLite, encrypted files under ./var, an
in-process Dramatiq worker. Production sets DATABASE_URL, REDIS_URL and BOARDWALK_S3_BUCKET.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from boardwalk import secrets_store
from boardwalk.env import env_bool, env_float, env_int, env_list, env_path, env_str

# Models load from local files only: nothing may download weights at run time.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

BASE_DIR = Path(__file__).resolve().parent.parent
DATA_DIR = env_path("BOARDWALK_DATA_DIR", BASE_DIR / "var")

# Any production service configured means production: then secrets must come from the
# environment. Inventing them per machine (or per container start) would make files
# unreadable on the other machines and API keys invalid.
PRODUCTION = bool(env_str("DATABASE_URL") or env_str("REDIS_URL") or env_str("BOARDWALK_S3_BUCKET"))
_embedded_secrets = None
_missing_secrets: list[str] = []


def _secret(variable: str, embedded_name: str) -> str:
    global _embedded_secrets
    value = env_str(variable)
    if value:
        return value
    if PRODUCTION:
        _missing_secrets.append(variable)
        return ""
    if _embedded_secrets is None:
        _embedded_secrets = secrets_store.load_or_create(DATA_DIR)
    return _embedded_secrets[embedded_name]


DEBUG = env_bool("DEBUG", False)
SECRET_KEY = _secret("DJANGO_SECRET_KEY", "django_secret_key")
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]", "testserver"])

# Behind a TLS-terminating proxy that sets X-Forwarded-Proto (docs/DEPLOYMENT.md).
if env_bool("BOARDWALK_HTTPS", False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_SSL_REDIRECT = True
    # Load balancers probe over plain HTTP.
    SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$", r"^metrics$"]
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_HSTS_SECONDS = env_int("BOARDWALK_HSTS_SECONDS", 31_536_000)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("BOARDWALK_HSTS_INCLUDE_SUBDOMAINS", True)
    SECURE_HSTS_PRELOAD = env_bool("BOARDWALK_HSTS_PRELOAD", True)

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "chartkick.django",  # static Chart.js + Chartkick.js for the usage dashboard (no CDN)
    "boardwalk",
    "inference",
    "files",
    "billing",
    "batches",
    "webhooks",
    "console",
    "project",  # the wiring's commands: serve, run_worker, bootstrap_demo
]

MIDDLEWARE = [
    "boardwalk.http.middleware.RequestIdMiddleware",
    # Then: refuses oversized or chunked bodies before anything reads them.
    "boardwalk.http.middleware.RequestLimitsMiddleware",
    "django.middleware.security.SecurityMiddleware",
    # Static files (the admin's CSS, the usage dashboard's Chart.js) from the app server.
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "project.urls"
WSGI_APPLICATION = "project.wsgi.application"
APPEND_SLASH = False

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
            ]
        },
    }
]

DATABASE_URL = env_str("DATABASE_URL")
if DATABASE_URL:
    # Persistent connections, checked before each request reuses one: a connection that
    # PostgreSQL dropped (restart, failover, terminated backend) is replaced, not a 500.
    DATABASES = {
        "default": dj_database_url.parse(DATABASE_URL, conn_max_age=60, conn_health_checks=True)
    }
    # Time bounds on every session, so a stuck or paused process cannot stall the others:
    # a lock wait gives up (the caller retries or answers 503), a runaway statement is
    # cancelled, and a transaction left open by a frozen process is ended, releasing its
    # row locks. Zero disables one. Values in milliseconds.
    DB_LOCK_TIMEOUT_MS = env_int("BOARDWALK_DB_LOCK_TIMEOUT_MS", 5_000)
    DB_STATEMENT_TIMEOUT_MS = env_int("BOARDWALK_DB_STATEMENT_TIMEOUT_MS", 60_000)
    DB_IDLE_IN_TRANSACTION_TIMEOUT_MS = env_int(
        "BOARDWALK_DB_IDLE_IN_TRANSACTION_TIMEOUT_MS", 30_000
    )
    _time_bounds = {
        "lock_timeout": DB_LOCK_TIMEOUT_MS,
        "statement_timeout": DB_STATEMENT_TIMEOUT_MS,
        "idle_in_transaction_session_timeout": DB_IDLE_IN_TRANSACTION_TIMEOUT_MS,
    }
    _options = DATABASES["default"].setdefault("OPTIONS", {})
    _options["options"] = " ".join(
        [*filter(None, [_options.get("options", "")])]
        + [f"-c {name}={value}" for name, value in _time_bounds.items()]
    )
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": str(DATA_DIR / "boardwalk.sqlite3"),
            "OPTIONS": {
                # IMMEDIATE: a write transaction takes the write lock at BEGIN, so two
                # writers queue on the busy timeout instead of failing mid-transaction.
                "transaction_mode": "IMMEDIATE",
                "timeout": 30,
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            },
        }
    }
if not DATABASE_URL:
    # SQLite creates its file (and -wal, -shm alike) with the umask's mode, usually 0644.
    secrets_store.private_file(Path(DATABASES["default"]["NAME"]))
    # A file, not :memory:, so that worker threads in the tests share the test database;
    # one per test process, so that parallel runs do not trample each other.
    DATABASES["default"]["TEST"] = {"NAME": str(DATA_DIR / f"test-{os.getpid()}.sqlite3")}
IS_POSTGRES = DATABASES["default"]["ENGINE"].endswith("postgresql")

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True
STATIC_URL = "static/"
STATIC_ROOT = DATA_DIR / "static"
# Served straight from the apps' static folders, so `make run` needs no collectstatic;
# `manage.py collectstatic` first lets WhiteNoise serve STATIC_ROOT with far-future caching.
WHITENOISE_USE_FINDERS = True
# WhiteNoise warns at start-up about a STATIC_ROOT that does not exist (no collectstatic yet).
with contextlib.suppress(OSError):
    STATIC_ROOT.mkdir(parents=True, exist_ok=True)

# Content storage: encrypted blobs only, through django-storages.
S3_BUCKET = env_str("BOARDWALK_S3_BUCKET")
if S3_BUCKET:
    CONTENT_STORAGE = {
        "BACKEND": "storages.backends.s3.S3Storage",
        "OPTIONS": {
            "bucket_name": S3_BUCKET,
            "endpoint_url": env_str("BOARDWALK_S3_ENDPOINT_URL") or None,
            "access_key": env_str("BOARDWALK_S3_ACCESS_KEY_ID") or None,
            "secret_key": env_str("BOARDWALK_S3_SECRET_ACCESS_KEY") or None,
            "region_name": env_str("BOARDWALK_S3_REGION", "us-east-1"),
            "location": env_str("BOARDWALK_S3_PREFIX", "boardwalk"),
            "file_overwrite": True,
            "default_acl": None,
        },
    }
else:
    CONTENT_STORAGE = {
        "BACKEND": "django.core.files.storage.FileSystemStorage",
        "OPTIONS": {
            "location": str(DATA_DIR / "content"),
            "file_permissions_mode": 0o600,
            "directory_permissions_mode": 0o700,
        },
    }
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    "content": CONTENT_STORAGE,
}

# Master keys wrap each file's data key: "id1:base64key,id2:base64key"; the first encrypts
# new files, the others still decrypt old ones (rotation).
MASTER_KEYS = _secret("BOARDWALK_MASTER_KEYS", "master_keys")
API_KEY_PEPPER = _secret("BOARDWALK_API_KEY_PEPPER", "api_key_pepper")
if _missing_secrets:
    raise ImproperlyConfigured(
        "DATABASE_URL, REDIS_URL or BOARDWALK_S3_BUCKET is set, so this is a production "
        f"configuration, and it lacks {', '.join(_missing_secrets)}. Set the same values on "
        "every machine; docs/DEPLOYMENT.md ('Configuration and secrets') says how to "
        "generate them."
    )

# Broker: Redis in production; unset means an in-process worker on a stub broker.
REDIS_URL = env_str("REDIS_URL")
BROKER_NAMESPACE = env_str("BOARDWALK_BROKER_NAMESPACE", "boardwalk")
WORKER_THREADS = env_int("BOARDWALK_WORKER_THREADS", 1)
# An idle worker's longest wait between two looks at each queue (Dramatiq's Redis consumer
# backs off up to this): how late a wake-up or a finalization can start. At 1 s a 3 s batch
# spent up to 2 s of it waiting (the wake-up, then the finalization); one look is one small
# Redis script per queue. On Redis a message sent rings a doorbell that wakes an idle consumer
# at once (boardwalk.broker.DoorbellRedisBroker): this wait is the fallback.
WORKER_POLL_MS = env_int("BOARDWALK_WORKER_POLL_MS", 100)
ENGINE_MAX_BATCH_SIZE = env_int("BOARDWALK_ENGINE_MAX_BATCH_SIZE", 32)
# While interactive requests are in flight, an engine keeps each step near this many ms by
# holding back batch rows and prompt pieces (inference/engine/pacing.py); 0 turns that off.
ENGINE_INTERACTIVE_STEP_MS = env_int("BOARDWALK_INTERACTIVE_STEP_MS", 75)
# Where this worker's engines run: "cpu", "cuda" or "cuda:N"; empty means cuda when a GPU is
# visible, else cpu. `run_worker --device` sets it per process (one worker per GPU).
ENGINE_DEVICE = env_str("BOARDWALK_ENGINE_DEVICE", "")
# GPUs this worker may use from its device on (0: every visible one). A tensor-parallel
# revision over more is left to other workers. `run_worker --devices` sets it for each worker
# it starts: the GPUs up to the next supervised device (1 each with `all`).
WORKER_GPUS = env_int("BOARDWALK_WORKER_GPUS", 0)
# Reuse of computed prompt prefixes (within one organization and deployment); off only to
# measure what it gives (benchmarks/platform_vs_engine.py --sectioned).
ENGINE_PREFIX_CACHE = env_bool("BOARDWALK_ENGINE_PREFIX_CACHE", True)
ENGINES_PER_PROCESS = env_int("BOARDWALK_ENGINES_PER_PROCESS", 1)
# Each engine runs in a child process of the worker, fed over pipes, so the worker's own
# Python (claims, prompts, records) never holds the interpreter lock the engine's steps need
# (inference/engine/process.py). Off: the engine runs inside the worker process (the tests).
ENGINE_PROCESS = env_bool("BOARDWALK_ENGINE_PROCESS", True)
ITEM_LEASE_SECONDS = env_int("BOARDWALK_ITEM_LEASE_SECONDS", 60)
ITEM_MAX_ATTEMPTS = env_int("BOARDWALK_ITEM_MAX_ATTEMPTS", 3)
# Worker liveness: each worker process stamps its row this often; a process silent for
# WORKER_DEAD_AFTER_SECONDS is dead and the others free its leases at once, so recovery
# after a crash takes seconds while item leases stay long (batches.liveness).
# One beat a second: on PostgreSQL a killed process is judged dead 2.5 beats after its last
# stamp, so the beat sets how soon its items run again (docs/PERFORMANCE.md, "Worker pipeline
# and scale-out"). A beat is one row update and one recovery query per process.
WORKER_HEARTBEAT_SECONDS = env_int("BOARDWALK_WORKER_HEARTBEAT_SECONDS", 1)
WORKER_DEAD_AFTER_SECONDS = env_int("BOARDWALK_WORKER_DEAD_AFTER_SECONDS", 8)
# The execution pipeline (batches.execution): items leased per claim query, and how many
# finished results one record transaction writes at most.
EXECUTION_CLAIM_GROUP = env_int("BOARDWALK_EXECUTION_CLAIM_GROUP", 16)
EXECUTION_RECORD_GROUP = env_int("BOARDWALK_EXECUTION_RECORD_GROUP", 64)
# "transformers" (the real engine) or "fake:<step ms>" (fixed-time steps, for the scale
# benchmark: it measures coordination, not the model).
ENGINE_BACKEND = env_str("BOARDWALK_ENGINE_BACKEND", "transformers")
# Decoding steps captured as CUDA graphs (inference/engine/graphs.py): on CUDA, one device per
# engine; off only to measure what they give.
ENGINE_CUDA_GRAPHS = env_bool("BOARDWALK_ENGINE_CUDA_GRAPHS", True)
# Revisions answered by an external engine (inference/external/; docs/DEPLOYMENT.md "Batches
# on an existing engine fleet"): how long one request may take once sent, and to connect;
# sends of one row at most (the first included); the in-flight limit's floor.
EXTERNAL_REQUEST_TIMEOUT_SECONDS = env_float("BOARDWALK_EXTERNAL_REQUEST_TIMEOUT_SECONDS", 300.0)
EXTERNAL_CONNECT_TIMEOUT_SECONDS = env_float("BOARDWALK_EXTERNAL_CONNECT_TIMEOUT_SECONDS", 10.0)
EXTERNAL_MAX_ATTEMPTS = env_int("BOARDWALK_EXTERNAL_MAX_ATTEMPTS", 3)
EXTERNAL_MIN_IN_FLIGHT = env_int("BOARDWALK_EXTERNAL_MIN_IN_FLIGHT", 1)
# The interactive tier (POST /v1/chat/completions; docs/API.md).
# Requests of one organization in flight at once (its answer's x-ratelimit-*-requests).
INTERACTIVE_MAX_CONCURRENT = env_int("BOARDWALK_INTERACTIVE_MAX_CONCURRENT", 16)
# Prompt + max output tokens one organization may start per minute.
INTERACTIVE_TOKENS_PER_MINUTE = env_int("BOARDWALK_INTERACTIVE_TOKENS_PER_MINUTE", 200_000)
# How long a request waits for a worker to take it before it answers 503.
INTERACTIVE_QUEUE_SECONDS = env_float("BOARDWALK_INTERACTIVE_QUEUE_SECONDS", 30.0)
# The longest a request runs once taken (then it is aborted and answers 503).
INTERACTIVE_TIMEOUT_SECONDS = env_float("BOARDWALK_INTERACTIVE_TIMEOUT_SECONDS", 600.0)
# A worker that served an interactive request keeps its engine this long for the next.
INTERACTIVE_LINGER_SECONDS = env_float("BOARDWALK_INTERACTIVE_LINGER_SECONDS", 30.0)
# Seconds a flex request without headroom is told to wait (Retry-After).
INTERACTIVE_FLEX_RETRY_AFTER = env_int("BOARDWALK_INTERACTIVE_FLEX_RETRY_AFTER", 2)
SWEEP_INTERVAL_SECONDS = env_int("BOARDWALK_SWEEP_INTERVAL_SECONDS", 15)
IDEMPOTENCY_WAIT_SECONDS = env_int("BOARDWALK_IDEMPOTENCY_WAIT_SECONDS", 10)
# Deployment batches hold an estimate of their GPU time (docs/BILLING.md "Deployment holds"): this
# many GPU-microseconds per prompt or output token, times the deployment's price.
GPU_MICROSECONDS_PER_TOKEN_ESTIMATE = env_int("BOARDWALK_GPU_US_PER_TOKEN_ESTIMATE", 2_000)
MAX_QUEUED_ITEMS = env_int("BOARDWALK_MAX_QUEUED_ITEMS", 100_000)
MODELS_DIR = env_path("BOARDWALK_MODELS_DIR", DATA_DIR / "models")
# Outbound HTTP (webhooks, image fetches) reaches public https addresses only; these comma-separated
# host:port targets are let through as named, over http too
# (docs/API.md "Limits, retention and privacy").
OUTBOUND_ALLOW = env_list("BOARDWALK_OUTBOUND_ALLOW", [])
# A PEM file of the certificate authorities outbound https trusts instead of the bundled
# public roots (a private network's CA, tests); empty: the public roots.
OUTBOUND_CA_BUNDLE = env_str("BOARDWALK_OUTBOUND_CA_BUNDLE")

# Media rows (docs/API.md "Images and audio"): what one image or audio part may weigh, an image's
# pixel count, and how image URLs are fetched by the worker (time per fetch, fetches at once per
# worker).
MEDIA_MAX_BYTES = env_int("BOARDWALK_MEDIA_MAX_BYTES", 10 * 1024 * 1024)
MEDIA_MAX_PIXELS = env_int("BOARDWALK_MEDIA_MAX_PIXELS", 25_000_000)
MEDIA_FETCH_TIMEOUT_SECONDS = env_float("BOARDWALK_MEDIA_FETCH_TIMEOUT_SECONDS", 10.0)
MEDIA_FETCH_THREADS = env_int("BOARDWALK_MEDIA_FETCH_THREADS", 8)

# The web server (`manage.py serve`, project/server.py): every read from a client is bounded.
HTTP_THREADS = env_int("BOARDWALK_HTTP_THREADS", 32)
HTTP_MAX_CONNECTIONS = env_int("BOARDWALK_HTTP_MAX_CONNECTIONS", 1000)
# Seconds a client has to send the request line and headers, all of them.
HTTP_HEADER_TIMEOUT = env_float("BOARDWALK_HTTP_HEADER_TIMEOUT", 10.0)
# Seconds a body read (or a response write) may wait without progress; after that long, a
# body must also have averaged HTTP_MIN_BODY_RATE bytes a second.
HTTP_READ_TIMEOUT = env_float("BOARDWALK_HTTP_READ_TIMEOUT", 30.0)
HTTP_MIN_BODY_RATE = env_float("BOARDWALK_HTTP_MIN_BODY_RATE", 4096.0)

# /metrics: this Bearer token when set; loopback clients only when unset.
METRICS_TOKEN = env_str("BOARDWALK_METRICS_TOKEN")
# Test only (tests/faults/): the named boardwalk.faultpoints point stops this process.
TEST_FAULT_POINT = env_str("BOARDWALK_TEST_FAULT_POINT")

# Uploads never go through Django's handlers: POST /v1/files parses its multipart body
# itself (files/multipart.py), validating and encrypting as bytes arrive; any other upload
# is refused, so nothing ever spools plaintext to disk.
FILE_UPLOAD_HANDLERS = ["files.upload.RefuseFileUploads"]
DATA_UPLOAD_MAX_MEMORY_SIZE = 1024 * 1024
# Input files up to this size have their prompt tokens counted inside the upload's request
# (a fraction of a second at this size), so a create that follows at once finds them;
# larger ones are counted by a worker after the upload (files.counting). 0: always by a worker.
UPLOAD_COUNT_INLINE_BYTES = env_int("BOARDWALK_UPLOAD_COUNT_INLINE_BYTES", 256 * 1024)

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["boardwalk.auth.ApiKeyAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["boardwalk.auth.HasDeclaredScope"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["boardwalk.http.parsers.BoundedJSONParser"],
    "DEFAULT_CONTENT_NEGOTIATION_CLASS": "boardwalk.http.negotiation.LenientContentNegotiation",
    "EXCEPTION_HANDLER": "boardwalk.errors.exception_handler",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "UNAUTHENTICATED_USER": None,
    "UNAUTHENTICATED_TOKEN": None,
}

SPECTACULAR_SETTINGS = {
    "TITLE": "Boardwalk Batch Inference API",
    "DESCRIPTION": "OpenAI Batch API compatible; see docs/API.md. Errors use one envelope.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SCHEMA_PATH_PREFIX": "/v1",
    "SECURITY": [{"bearer": []}],
    "APPEND_COMPONENTS": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
    "AUTHENTICATION_WHITELIST": [],
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    "loggers": {
        "django.request": {"level": "ERROR"},
        # One line per request to an external engine's server (hundreds a second in a
        # worker dispatching a batch); its failures reach the log through inference.external.
        "httpx2": {"level": "WARNING"},
        "httpx": {"level": "WARNING"},
    },
}
