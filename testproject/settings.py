"""Settings of the demo and test project. Configure it with environment variables:

DATABASE_URL   postgres://user:password@host:port/name (default: the local server)
DEBUG          true/false (default: false)
SECRET_KEY     (default: an insecure development key)
ALLOWED_HOSTS  comma-separated (default: localhost,127.0.0.1)
"""

import json
from collections.abc import Callable
from pathlib import Path

import environ

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env(
    DEBUG=(bool, False),
    SECRET_KEY=(str, "django-insecure-demo-key-change-me"),
    ALLOWED_HOSTS=(list, ["localhost", "127.0.0.1"]),
)

DEBUG = env("DEBUG")
SECRET_KEY = env("SECRET_KEY")
ALLOWED_HOSTS = env("ALLOWED_HOSTS")

DATABASES = {
    "default": env.db_url("DATABASE_URL", default="postgres://postgres@127.0.0.1:5432/django_jobs"),
}
# A read-only alias on the same database, as a streaming replica would be: the tests point
# JOBS_READ_DATABASE at it (tests/integration/test_read_database.py creates the role). Nothing
# uses it unless JOBS_READ_DATABASE names it.
DATABASES["replica"] = {
    **DATABASES["default"],
    "USER": "django_jobs_reader",
    "PASSWORD": "django_jobs_reader",
    "TEST": {"MIRROR": "default"},
}
# READ_DATABASE_URL points the alias elsewhere (a replica, or a port where nothing listens).
if "READ_DATABASE_URL" in env.ENVIRON:
    DATABASES["replica"] = {**env.db_url("READ_DATABASE_URL"), "TEST": {"MIRROR": "default"}}
# Behind pgbouncer in transaction-pooling mode (DATABASE_POOLER=transaction): no server-side
# cursors, which would need a session. Django's psycopg backend prepares no statements by default.
if env.str("DATABASE_POOLER", default="") == "transaction":
    DATABASES["default"]["DISABLE_SERVER_SIDE_CURSORS"] = True

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_jobs",
    "testproject.examples",
    "testproject.testjobs",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "testproject.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

WSGI_APPLICATION = "testproject.wsgi.application"
USE_TZ = True
TIME_ZONE = "UTC"
STATIC_URL = "static/"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

JOBS_QUEUES = ["default", "reports", "imports"]

# Tasks that workers of the HTTP API run (examples/curl-worker.sh): declared here, so that their
# jobs can be enqueued and are checked; database-connected workers never claim them.
JOBS_REMOTE_TASKS = {
    "remote.upper": {"queue": "remote", "timeout": 60},
    "remote.count": {"queue": "remote", "timeout": 60},
}

# Django's Tasks framework, served by django-jobs (testproject/testjobs/tasks.py). Retries are
# quick so that the tests can watch them.
TASKS = {
    "default": {
        "BACKEND": "django_jobs.backend.JobsBackend",
        "QUEUES": ["default", "reports"],
        "OPTIONS": {"max_attempts": 2, "timeout": 120, "retry_backoff": (0.2, 0.2)},
    },
}

# Timing settings may come from the environment, so tests can run workers on short clocks.
_FROM_ENVIRONMENT: list[tuple[str, Callable[[str], object]]] = [
    ("JOBS_HEARTBEAT_INTERVAL", float),
    ("JOBS_WORKER_TIMEOUT", float),
    ("JOBS_KILL_GRACE", float),
    ("JOBS_POLL_INTERVAL", float),
    ("JOBS_TIMEOUT_GRACE", float),
    ("JOBS_LIVENESS_CHECK", str),
    ("JOBS_LISTEN", lambda v: v.lower() in ("1", "true", "yes")),
    ("JOBS_LISTEN_DATABASE_URL", str),
    ("JOBS_LOCK_TIMEOUT_MS", int),
    ("JOBS_STATEMENT_TIMEOUT_MS", int),
    ("JOBS_UNKNOWN_TASK_DELAY", float),
    ("JOBS_UNKNOWN_TASK_TIMEOUT", float),
    ("JOBS_SCHEDULES", json.loads),
    ("JOBS_SCHEDULE_GRACE", float),
    ("JOBS_SCHEDULER_INTERVAL", float),
    ("JOBS_PROGRESS_INTERVAL", float),
    ("JOBS_ATTEMPT_LOG_BYTES", int),
    ("JOBS_CAPTURE_LOG_LEVEL", str),
    ("JOBS_QUEUE_LIMITS", json.loads),
    ("JOBS_QUEUE_RATE_LIMITS", json.loads),
    ("JOBS_FAIR_QUEUES", json.loads),
    ("JOBS_EXPIRY_INTERVAL", float),
    ("JOBS_API_CONNECTIONS", int),
    ("JOBS_API_MAX_WAIT", float),
    ("JOBS_READ_DATABASE", str),
    ("JOBS_READ_CONNECT_TIMEOUT", int),
    ("JOBS_API_BODY_TIMEOUT", float),
    ("JOBS_ALERTS", json.loads),
    ("JOBS_ROLLUP_INTERVAL", float),
]
for _name, _cast in _FROM_ENVIRONMENT:
    if _name in env.ENVIRON:
        globals()[_name] = _cast(env.ENVIRON[_name])
