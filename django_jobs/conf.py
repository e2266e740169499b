"""Settings of django-jobs, each read through one documented function.

Every setting is optional. Read them only through these functions, so that defaults live here
and nowhere else. Values are read on each call, so ``override_settings`` works in tests.
"""

from __future__ import annotations

import ipaddress
import logging
import re
from datetime import timedelta
from typing import Any, NamedTuple

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from django_jobs.exceptions import InvalidOption


def _get(name: str, default: Any) -> Any:
    return getattr(settings, name, default)


DEFAULT_SENSITIVE_KEYS = (
    "password",
    "passwd",
    "token",
    "secret",
    "api_key",
    "apikey",
    "authorization",
    "credential",
    "private_key",
)


def sensitive_keys() -> tuple[str, ...]:
    """``JOBS_SENSITIVE_KEYS``: substrings of key names whose values are masked (case-insensitive)
    in the admin, the logs and stored tracebacks. Default: password, passwd, token, secret,
    api_key, apikey, authorization, credential, private_key."""
    return tuple(k.lower() for k in _get("JOBS_SENSITIVE_KEYS", DEFAULT_SENSITIVE_KEYS))


def database_alias() -> str:
    """``JOBS_DATABASE``: the database alias that holds the job tables. Default ``"default"``."""
    return str(_get("JOBS_DATABASE", "default"))


def default_queue() -> str:
    """``JOBS_DEFAULT_QUEUE``: the queue of a ``@job`` that names none. Default ``"default"``."""
    return str(_get("JOBS_DEFAULT_QUEUE", "default"))


def queues() -> list[str] | None:
    """``JOBS_QUEUES``: the queues you use, for the admin's filters. Default ``None``: the
    default queue plus every queue named by a registered task
    (:meth:`django_jobs.registry.Registry.queues`)."""
    configured = _get("JOBS_QUEUES", None)
    return None if configured is None else list(configured)


def default_max_attempts() -> int:
    """``JOBS_DEFAULT_MAX_ATTEMPTS``: attempts of a job whose task sets none. Default 3.

    Delivery is at-least-once: a job whose worker died is retried while attempts remain."""
    return int(_get("JOBS_DEFAULT_MAX_ATTEMPTS", 3))


def default_timeout() -> int | None:
    """``JOBS_DEFAULT_TIMEOUT``: seconds a job may run before it is stopped, for tasks that set
    no ``timeout``. Default ``None`` (no limit)."""
    value = _get("JOBS_DEFAULT_TIMEOUT", None)
    return None if value is None else int(value)


def max_payload_bytes() -> int:
    """``JOBS_MAX_PAYLOAD_BYTES``: the largest JSON encoding of a job's args plus kwargs.
    Default 256 KiB. Pass large data by reference (a key, a path), not by value."""
    return int(_get("JOBS_MAX_PAYLOAD_BYTES", 256 * 1024))


def worker_name() -> str | None:
    """``JOBS_WORKER_ID``: the base name of worker ids. Default: ``POD_NAME``, then the host name.

    A pid and a short random id are always appended, so that two boots never share an id."""
    value = _get("JOBS_WORKER_ID", None)
    return str(value) if value else None


def poll_interval() -> float:
    """``JOBS_POLL_INTERVAL``: seconds an idle worker waits between looks for ready jobs
    (jittered by up to 20%). Default 1.0."""
    return float(_get("JOBS_POLL_INTERVAL", 1.0))


def heartbeat_interval() -> float:
    """``JOBS_HEARTBEAT_INTERVAL``: seconds between a worker's heartbeats. Default 10."""
    return float(_get("JOBS_HEARTBEAT_INTERVAL", 10.0))


def worker_timeout() -> float:
    """``JOBS_WORKER_TIMEOUT``: seconds without a heartbeat after which a worker counts as gone
    and the reaper recovers its jobs. Default 60; keep it several heartbeat intervals long."""
    return float(_get("JOBS_WORKER_TIMEOUT", 60.0))


def timeout_grace() -> float:
    """``JOBS_TIMEOUT_GRACE``: seconds past a job's timeout before the reaper treats it as stuck
    (the worker itself stops it at the timeout). Default 60."""
    return float(_get("JOBS_TIMEOUT_GRACE", 60.0))


def kill_grace() -> float:
    """``JOBS_KILL_GRACE``: seconds a job process gets after SIGTERM before SIGKILL. Default 5."""
    return float(_get("JOBS_KILL_GRACE", 5.0))


def unknown_task_delay() -> float:
    """``JOBS_UNKNOWN_TASK_DELAY``: seconds a worker passes over the jobs of a task it has not
    registered, after it has handed one back (a rolling deploy, say; handing back costs no
    attempt). Other workers take them meanwhile. Default 5."""
    return float(_get("JOBS_UNKNOWN_TASK_DELAY", 5.0))


def unknown_task_timeout() -> float:
    """``JOBS_UNKNOWN_TASK_TIMEOUT``: seconds a job may wait for a worker that has registered
    its task before it ends in ``error`` (counted from the first worker that did not have it,
    and only while no live worker has it). Default 3600."""
    return float(_get("JOBS_UNKNOWN_TASK_TIMEOUT", 3600.0))


def retry_backoff() -> tuple[float, float]:
    """``JOBS_RETRY_BACKOFF``: ``(base, cap)`` seconds of the default exponential backoff:
    ``min(cap, base * 2 ** (attempt - 1))``, jittered over its upper half. Default (5, 3600)."""
    base, cap = _get("JOBS_RETRY_BACKOFF", (5.0, 3600.0))
    return float(base), float(cap)


def lock_timeout_ms() -> int:
    """``JOBS_LOCK_TIMEOUT_MS``: lock wait limit of the job system's statements. Default 5000."""
    return int(_get("JOBS_LOCK_TIMEOUT_MS", 5000))


def statement_timeout_ms() -> int:
    """``JOBS_STATEMENT_TIMEOUT_MS``: statement time limit of the job system's own statements.
    Default 30000."""
    return int(_get("JOBS_STATEMENT_TIMEOUT_MS", 30000))


def liveness_check_path() -> str:
    """``JOBS_LIVENESS_CHECK``: dotted path of the class that tells the reaper which workers are
    gone. Default ``"django_jobs.liveness.HeartbeatLiveness"``; on Kubernetes consider
    ``"django_jobs.liveness.KubernetesLiveness"``."""
    return str(_get("JOBS_LIVENESS_CHECK", "django_jobs.liveness.HeartbeatLiveness"))


KUBERNETES_OPTIONS = frozenset(
    {
        "api_url",
        "token",
        "ca_file",
        "verify",
        "allow_insecure_http",
        "kubeconfig",
        "namespace",
        "label_selector",
        "container",
    }
)


def kubernetes_options() -> dict[str, Any]:
    """``JOBS_KUBERNETES``: options of ``KubernetesLiveness``, a dict. Default ``{}``: use the
    pod's service account, else the kubeconfig.

    - ``api_url``, ``token``: the API server and a bearer token, instead of the service account.
    - ``ca_file`` (default: the system's CAs), ``verify`` (default True): how ``api_url``'s
      certificate is checked.
    - ``allow_insecure_http`` (default False): send ``token`` to an ``http://`` ``api_url``,
      in clear text. Without it, that is refused with ``ImproperlyConfigured``.
    - ``kubeconfig`` (default ``KUBECONFIG``, then ``~/.kube/config``): used outside a pod.
    - ``namespace`` (default: the service account's, the kubeconfig context's, or
      ``"default"``) and ``label_selector`` (default: none): which pods are listed.
    - ``container`` (default: the pod's ``kubectl.kubernetes.io/default-container``
      annotation, else its first container): the worker's container, whose restarts count."""
    options = dict(_get("JOBS_KUBERNETES", {}))
    unknown = set(options) - KUBERNETES_OPTIONS
    if unknown:
        raise ImproperlyConfigured(
            f"JOBS_KUBERNETES has unknown keys {sorted(unknown)}; use "
            f"{', '.join(repr(k) for k in sorted(KUBERNETES_OPTIONS))}"
        )
    return options


def listen() -> bool:
    """``JOBS_LISTEN``: whether idle workers LISTEN for enqueue notifications and wake at once.
    Default True. Polling (``JOBS_POLL_INTERVAL``) remains the safety net either way. Behind
    pgbouncer in transaction-pooling mode, LISTEN cannot work through the pooler: set this to
    False, or point ``JOBS_LISTEN_DATABASE_URL`` at the server directly."""
    return bool(_get("JOBS_LISTEN", True))


def listen_database_url() -> str | None:
    """``JOBS_LISTEN_DATABASE_URL``: a libpq URL for the worker's one LISTEN connection, for
    when ``JOBS_DATABASE`` goes through a transaction-pooling pgbouncer. Default: none (use the
    ``JOBS_DATABASE`` connection settings)."""
    value = _get("JOBS_LISTEN_DATABASE_URL", None)
    return str(value) if value else None


class Retention(NamedTuple):
    older_than: timedelta
    states: tuple[str, ...]


def retention() -> Retention:
    """``JOBS_RETENTION``: what ``manage.py prunejobs`` deletes when given no options: finished
    jobs in ``states`` whose ``finished_at`` is more than ``older_than`` ago, with their attempts
    and dependency rows. A dict; missing keys keep their default. Default
    ``{"older_than": "14d", "states": ["done", "cancelled", "error"]}``.

    ``older_than`` is a ``timedelta``, a number of seconds, or a string such as ``"36h"`` or
    ``"14d"`` (see :func:`parse_duration`). ``states`` may only name finished states."""
    from django_jobs.states import TERMINAL_STATES

    configured = dict(_get("JOBS_RETENTION", {}))
    unknown = set(configured) - {"older_than", "states"}
    if unknown:
        raise ImproperlyConfigured(
            f"JOBS_RETENTION has unknown keys {sorted(unknown)}; use 'older_than' and 'states'"
        )
    try:
        older_than = parse_duration(configured.get("older_than", "14d"))
    except ValueError as exc:
        raise ImproperlyConfigured(f"JOBS_RETENTION['older_than']: {exc}") from None
    states = configured.get("states", ("done", "cancelled", "error"))
    if isinstance(states, str):
        states = states.split(",")
    states = tuple(str(s).strip() for s in states)
    if not states or not set(states) <= TERMINAL_STATES:
        raise ImproperlyConfigured(
            f"JOBS_RETENTION['states'] must name finished states only "
            f"({', '.join(sorted(TERMINAL_STATES))}), not {list(states)}"
        )
    return Retention(older_than, states)


_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(s|m|h|d|w)?")
_UNIT_SECONDS = {None: 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(value: str | float | timedelta) -> timedelta:
    """A duration as written in settings and on the command line: a ``timedelta``, a number of
    seconds, or a number with a unit (``s``, ``m``, ``h``, ``d``, ``w``): ``"90s"``, ``"12h"``,
    ``"14d"``. Raises ``InvalidOption`` (a ``ValueError``) for anything else, or a negative
    duration."""
    if isinstance(value, timedelta):
        duration = value
    elif isinstance(value, int | float) and not isinstance(value, bool):
        duration = timedelta(seconds=value)
    else:
        match = _DURATION.fullmatch(str(value).strip().lower())
        if match is None:
            raise InvalidOption(
                f"expected a duration such as 90s, 15m, 12h, 14d or 2w, got {value!r}"
            )
        duration = timedelta(seconds=float(match[1]) * _UNIT_SECONDS[match[2]])
    if duration < timedelta(0):
        raise InvalidOption(f"a duration cannot be negative, got {value!r}")
    return duration


def tasks_backends() -> dict[str, dict[str, Any]]:
    """Django's ``TASKS`` setting: the backends of Django's Tasks framework, by alias. Read here
    only to find the aliases served by ``django_jobs.backend.JobsBackend``; each backend gets its
    own ``QUEUES`` and ``OPTIONS`` from Django. Default ``{}``."""
    return {str(alias): dict(params) for alias, params in dict(_get("TASKS", {})).items()}


def schedules() -> dict[str, dict[str, Any]]:
    """``JOBS_SCHEDULES``: periodic jobs declared in settings, by schedule name: ``{"nightly":
    {"task": "reports.build", "cron": "0 3 * * *", "args": [], "kwargs": {}, "timezone": "UTC",
    "queue": "", "priority": None, "catch_up": "skip", "overlap": "allow"}}`` (only ``task`` and
    ``cron`` are required). Default ``{}``. Checked by ``manage.py check``."""
    value = _get("JOBS_SCHEDULES", {})
    return dict(value) if isinstance(value, dict) else value


def schedule_grace() -> float:
    """``JOBS_SCHEDULE_GRACE``: seconds a periodic job's tick may be late when a scheduler first
    sees it and still run (schedules with ``catch_up="skip"``). Default 120."""
    return float(_get("JOBS_SCHEDULE_GRACE", 120.0))


def scheduler_interval() -> float:
    """``JOBS_SCHEDULER_INTERVAL``: the longest a scheduler sleeps between looks at the
    schedules table, so that an edit in the admin takes effect within it. Default 30."""
    return float(_get("JOBS_SCHEDULER_INTERVAL", 30.0))


def rollup_retention() -> timedelta:
    """``JOBS_ROLLUP_RETENTION``: how long ``prunejobs`` keeps the hourly rollups (a duration as
    :func:`parse_duration` reads it). Their all-time totals are never deleted. Default
    ``"400d"``: a year and a month, for a year-on-year look."""
    value = _get("JOBS_ROLLUP_RETENTION", "400d")
    try:
        retention = parse_duration(value)
    except (ValueError, OverflowError) as exc:
        raise ImproperlyConfigured(f"JOBS_ROLLUP_RETENTION: {exc}") from None
    if not timedelta(days=1) <= retention <= timedelta(days=36500):
        raise ImproperlyConfigured(
            f"JOBS_ROLLUP_RETENTION: expected from 1 day to 100 years, such as '400d', not "
            f"{value!r} (a bare number is seconds)"
        )
    return retention


def expiry_interval() -> float:
    """``JOBS_EXPIRY_INTERVAL``: seconds between a worker's looks for pending jobs past their
    deadline (``expires_after``, ``expires_at``), which it ends cancelled as expired (a look is
    one probe of an index of pending jobs with a deadline). No claim takes such a job in any
    case; the look makes its end visible. 0 turns the worker's looks off (``manage.py
    reapjobs`` looks on each pass). Default 5."""
    value = _get("JOBS_EXPIRY_INTERVAL", 5.0)
    try:
        seconds = -1.0 if isinstance(value, bool) else float(value)
    except (TypeError, ValueError):
        seconds = -1.0
    if not (seconds == 0 or 0.1 <= seconds <= 86400):
        raise ImproperlyConfigured(
            f"JOBS_EXPIRY_INTERVAL: expected seconds from 0.1 to 86400, or 0 to turn the looks"
            f" off, not {value!r}"
        )
    return seconds


def rollup_interval() -> float:
    """``JOBS_ROLLUP_INTERVAL``: seconds between a worker's looks at whether an hour is due to be
    rolled up (a look costs one indexed read of one row). 0 turns the worker's passes off (then
    run ``manage.py prunejobs`` or ``manage.py rollupjobs`` from cron). Default 60."""
    value = _get("JOBS_ROLLUP_INTERVAL", 60.0)
    try:
        seconds = -1.0 if isinstance(value, bool) else float(value)
    except (TypeError, ValueError):
        seconds = -1.0
    if not (seconds == 0 or 1 <= seconds <= 86400):
        raise ImproperlyConfigured(
            f"JOBS_ROLLUP_INTERVAL: expected seconds from 1 to 86400, or 0 to turn the passes "
            f"off, not {value!r}"
        )
    return seconds


IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


def metrics_allowed_ips() -> list[IPNetwork]:
    """``JOBS_METRICS_ALLOWED_IPS``: the addresses and networks (``"10.0.0.0/8"``,
    ``"127.0.0.1"``, ``"::1"``) from which the Prometheus endpoint answers without a token.
    Default ``[]``."""
    value = _get("JOBS_METRICS_ALLOWED_IPS", [])
    if isinstance(value, str) or not isinstance(value, list | tuple):
        raise ImproperlyConfigured(
            f"JOBS_METRICS_ALLOWED_IPS: expected a list of addresses or CIDRs, not {value!r}"
        )
    networks = []
    for entry in value:
        try:
            networks.append(ipaddress.ip_network(str(entry).strip(), strict=False))
        except ValueError:
            raise ImproperlyConfigured(
                f"JOBS_METRICS_ALLOWED_IPS: {entry!r} is not an address or a CIDR such as "
                "'10.0.0.0/8'"
            ) from None
    return networks


def metrics_tokens() -> list[str]:
    """``JOBS_METRICS_TOKENS``: bearer tokens any of which opens the Prometheus endpoint
    (``Authorization: Bearer <token>``), from any address. Default ``[]``."""
    value = _get("JOBS_METRICS_TOKENS", [])
    if isinstance(value, str) or not isinstance(value, list | tuple):
        raise ImproperlyConfigured(
            f"JOBS_METRICS_TOKENS: expected a list of strings, not {value!r}"
        )
    for token in value:
        if not isinstance(token, str) or len(token) < 16 or not all("!" <= c <= "~" for c in token):
            raise ImproperlyConfigured(
                "JOBS_METRICS_TOKENS: each token must be a string of at least 16 printable "
                "ASCII characters, without spaces (make one with `python -c 'import secrets; "
                "print(secrets.token_urlsafe(32))'`)"
            )
    return list(value)


def read_database_alias() -> str:
    """``JOBS_READ_DATABASE``: the database alias of the read-only queries of the admin's
    dashboard, ``jobstats`` and the readers of :mod:`django_jobs.stats` (a streaming replica,
    say). The job list, the actions, the queue controls (paused or not, limits) and every write
    stay on ``JOBS_DATABASE``, so that a replica that lags never shows a paused queue as open.
    Default: the alias of ``JOBS_DATABASE``."""
    return str(_get("JOBS_READ_DATABASE", None) or database_alias())


def read_connect_timeout() -> int:
    """``JOBS_READ_CONNECT_TIMEOUT``: seconds the reads of ``JOBS_READ_DATABASE`` wait for a
    connection to it (libpq's ``connect_timeout``; at least 2), when it is not the alias of
    ``JOBS_DATABASE`` and its ``OPTIONS`` set no ``connect_timeout`` of their own. Default 5.
    Its statements are bounded by ``JOBS_STATEMENT_TIMEOUT_MS`` like every statement of the job
    system. A read database that does not answer in time is reported on the dashboard, which
    then reads the primary, and by ``jobstats``, which exits."""
    return max(2, int(_get("JOBS_READ_CONNECT_TIMEOUT", 5)))


def progress_interval() -> float:
    """``JOBS_PROGRESS_INTERVAL``: the fewest seconds between two writes of a running job's
    progress and live log (the last value is always written when the attempt ends). Default 2."""
    return float(_get("JOBS_PROGRESS_INTERVAL", 2.0))


def cursor_interval() -> float:
    """``JOBS_CURSOR_INTERVAL``: the fewest seconds between two writes of a running job's cursors
    (``context.save_cursor``) by its worker, which writes the newest values; the last values are
    always written when the attempt ends or is released. A worker killed outright loses at most
    this many seconds of saves. Default 0.05."""
    return max(0.0, float(_get("JOBS_CURSOR_INTERVAL", 0.05)))


def capture_log_level() -> int:
    """``JOBS_CAPTURE_LOG_LEVEL``: the lowest level of the log records a job's attempt keeps (a
    level name or number). Default ``"INFO"``."""
    value = _get("JOBS_CAPTURE_LOG_LEVEL", "INFO")
    if isinstance(value, int):
        return value
    level = logging.getLevelName(str(value).upper())
    if not isinstance(level, int):
        raise ImproperlyConfigured(f"JOBS_CAPTURE_LOG_LEVEL: {value!r} is not a logging level")
    return level


def attempt_log_bytes() -> int:
    """``JOBS_ATTEMPT_LOG_BYTES``: how much of what an attempt printed and logged is kept: its
    last bytes, with a marker where the rest was cut. 0 captures nothing. Default 64 KiB."""
    return max(0, int(_get("JOBS_ATTEMPT_LOG_BYTES", 64 * 1024)))


def queue_limits() -> dict[str, int]:
    """``JOBS_QUEUE_LIMITS``: cluster-wide limits on running jobs per queue, ``{"gpu": 4}``.
    Synced into the queue table when a worker starts (an admin edit of a queue's limit wins
    over it). Default ``{}``. Checked by ``manage.py check``; read with
    :func:`django_jobs.queues.controls.check_limits`."""
    value = _get("JOBS_QUEUE_LIMITS", {})
    return dict(value) if isinstance(value, dict) else value


def queue_rate_limits() -> Any:
    """``JOBS_QUEUE_RATE_LIMITS``: cluster-wide rate limits on the starts of a queue's jobs,
    ``{"emails": "100/m"}``: at most that many in any window of that length (a sliding window;
    see :mod:`django_jobs.rates`). Synced into the queue table when a worker starts (an admin
    edit wins over it). Default ``{}``. Checked by ``manage.py check``."""
    value = _get("JOBS_QUEUE_RATE_LIMITS", {})
    return dict(value) if isinstance(value, dict) else value


def fair_queues() -> Any:
    """``JOBS_FAIR_QUEUES``: queues whose jobs are claimed round-robin across their concurrency
    keys (tenants), ``["imports"]``, so that one key's backlog does not hold back another's
    jobs. Synced into the queue table when a worker starts. Default ``[]``."""
    value = _get("JOBS_FAIR_QUEUES", [])
    return list(value) if isinstance(value, list | tuple | set | frozenset) else value


def remote_tasks() -> Any:
    """``JOBS_REMOTE_TASKS``: tasks run by workers of the HTTP API, declared here so that their
    jobs are checked at enqueue like any other: ``{"ml.train": {"queue": "gpu", "timeout":
    7200}}`` (options: queue, priority, max_attempts, timeout, concurrency_limit,
    expected_duration). Default ``{}``. See :func:`django_jobs.tasks.remote_job`."""
    return _get("JOBS_REMOTE_TASKS", {})


def api_connections() -> int:
    """``JOBS_API_CONNECTIONS``: the database connections one process serving the HTTP API
    uses for its statements (claims, finishes, heartbeats, enqueues); it holds one more for its
    LISTEN. Default 4."""
    return max(1, int(_get("JOBS_API_CONNECTIONS", 4)))


def api_body_timeout() -> float:
    """``JOBS_API_BODY_TIMEOUT``: seconds a request served by ``with_api`` has to send its
    whole body, once its headers and token are checked; then it is answered 408 and its
    connection closed. Default 10."""
    return float(_get("JOBS_API_BODY_TIMEOUT", 10.0))


def api_max_wait() -> float:
    """``JOBS_API_MAX_WAIT``: the longest ``wait`` of a claim over the HTTP API, in seconds.
    Default 30; keep it under the proxy's and the ASGI server's request timeouts."""
    return float(_get("JOBS_API_MAX_WAIT", 30.0))


#: The keys of ``JOBS_ALERTS``, and the subject that stands for every schedule or queue not named
#: in a per-subject threshold.
ALERT_KEYS = frozenset(
    {"schedule_grace", "queue_age", "no_worker", "expected_duration", "overdue", "exhausted"}
)
ALERT_DEFAULT_SUBJECT = "*"


class Alerts(NamedTuple):
    """``JOBS_ALERTS`` checked, with its defaults. Seconds are floats; ``inf`` turns an alert
    off. Per-subject thresholds are dicts of name to seconds, with :data:`ALERT_DEFAULT_SUBJECT`
    for every other name."""

    #: Seconds a schedule's run may take, after the tick it was due at, to succeed.
    schedule_grace: dict[str, float]
    #: Seconds the oldest ready job of a queue may wait.
    queue_age: dict[str, float]
    #: Seconds the oldest ready job of a queue may wait while no live worker serves the queue.
    no_worker: dict[str, float]
    #: Seconds a job may run, by task, from the setting (they win over ``@job``'s
    #: ``expected_duration``).
    expected_duration: dict[str, float]
    #: Without an expected duration, a job is overdue past ``p95_factor`` times its task's p95,
    #: and at least ``overdue_min_seconds``.
    p95_factor: float
    overdue_min_seconds: float
    #: Jobs of one task that used up their attempts within ``exhausted_window`` seconds, from
    #: which the alert fires.
    exhausted_threshold: float
    exhausted_window: float


def alerts() -> Alerts:
    """``JOBS_ALERTS``: the thresholds of the ``django_jobs_alerts`` view and ``manage.py
    jobsalerts`` (see docs/operations.md), a dict; every key is optional. Durations are seconds
    or strings such as ``"10m"`` (:func:`parse_duration`); ``None`` turns the alert off. Default::

        JOBS_ALERTS = {
            # a schedule's run must succeed within this long after the tick it was due at
            "schedule_grace": 600,           # or {"*": 600, "nightly-report": "2h"}
            # the oldest ready job of a queue may wait this long
            "queue_age": 600,                # or {"*": 600, "emails": 60, "batch": None}
            # ... and this long while no live worker serves its queue
            "no_worker": 60,
            # seconds a task's job may run; wins over @job(expected_duration=...); None: never
            # overdue
            "expected_duration": {},         # {"ml.train": "2h"}
            # tasks without one: overdue past 3 times the p95 of their recent runs, at least 300 s
            "overdue": {"p95_factor": 3, "min_seconds": 300},
            # 5 jobs of a task that used up their attempts within an hour
            "exhausted": {"threshold": 5, "window": 3600},
        }

    In a per-name dict, ``"*"`` is every schedule or queue not named (a key ``"default"`` names
    the queue called "default"). The worker, the scheduler, ``syncschedules`` and ``jobsalerts``
    write these into the table ``django_jobs_alert_threshold``, which the view reads. Raises
    ``ImproperlyConfigured`` naming the first bad value; ``manage.py check`` reports it."""
    configured = _get("JOBS_ALERTS", {})
    if not isinstance(configured, dict):
        raise ImproperlyConfigured(f"JOBS_ALERTS must be a dict, not {configured!r}")
    unknown = set(configured) - ALERT_KEYS
    if unknown:
        raise ImproperlyConfigured(
            f"JOBS_ALERTS has unknown keys {sorted(map(str, unknown))}; use "
            f"{', '.join(repr(k) for k in sorted(ALERT_KEYS))}"
        )
    overdue = _alert_options(
        configured, "overdue", {"p95_factor": 3, "min_seconds": 300}, off="p95_factor"
    )
    exhausted = _alert_options(
        configured, "exhausted", {"threshold": 5, "window": 3600}, off="threshold"
    )
    factor = overdue["p95_factor"]
    if factor is not None and (
        isinstance(factor, bool) or not isinstance(factor, int | float) or not factor >= 1
    ):
        raise ImproperlyConfigured(
            f"JOBS_ALERTS['overdue']['p95_factor'] must be a number from 1, not {factor!r}"
        )
    threshold = exhausted["threshold"]
    if threshold is not None and (
        isinstance(threshold, bool) or not isinstance(threshold, int) or threshold < 1
    ):
        raise ImproperlyConfigured(
            "JOBS_ALERTS['exhausted']['threshold'] must be a whole number of jobs from 1, "
            f"not {threshold!r}"
        )
    window = _alert_seconds(exhausted["window"], "JOBS_ALERTS['exhausted']['window']")
    if not 0 < window <= 86400:
        raise ImproperlyConfigured(
            "JOBS_ALERTS['exhausted']['window'] must be a duration longer than 0 and at most "
            f"a day, not {exhausted['window']!r}"
        )
    expected = configured.get("expected_duration", {})
    if not isinstance(expected, dict):
        raise ImproperlyConfigured(
            "JOBS_ALERTS['expected_duration'] must be a dict of task name to seconds, like "
            f"{{'ml.train': 7200}}, not {expected!r}"
        )
    return Alerts(
        schedule_grace=_per_subject(configured, "schedule_grace", 600.0),
        queue_age=_per_subject(configured, "queue_age", 600.0),
        no_worker=_per_subject(configured, "no_worker", 60.0),
        expected_duration={
            _alert_name(task, "JOBS_ALERTS['expected_duration']"): _alert_seconds(
                seconds, f"JOBS_ALERTS['expected_duration'][{task!r}]", positive=True
            )
            for task, seconds in expected.items()
        },
        p95_factor=float("inf") if factor is None else float(factor),
        overdue_min_seconds=_alert_seconds(
            overdue["min_seconds"], "JOBS_ALERTS['overdue']['min_seconds']"
        ),
        exhausted_threshold=float("inf") if threshold is None else float(threshold),
        exhausted_window=window,
    )


def _alert_options(
    configured: dict[Any, Any], key: str, defaults: dict[str, Any], off: str
) -> dict[str, Any]:
    """A dict-valued key of ``JOBS_ALERTS`` with its defaults; ``None`` sets ``off`` to None."""
    value = configured.get(key, defaults)
    if value is None:
        return {**defaults, off: None}
    if not isinstance(value, dict) or set(value) - set(defaults):
        raise ImproperlyConfigured(
            f"JOBS_ALERTS[{key!r}] must be None or a dict with the keys "
            f"{', '.join(repr(k) for k in defaults)}, not {value!r}"
        )
    return {**defaults, **value}


def _per_subject(configured: dict[Any, Any], key: str, default: float) -> dict[str, float]:
    """A threshold given for all (a duration, or ``None``) or per name (a dict)."""
    value = configured.get(key, default)
    where = f"JOBS_ALERTS[{key!r}]"
    if not isinstance(value, dict):
        return {ALERT_DEFAULT_SUBJECT: _alert_seconds(value, where)}
    found = {ALERT_DEFAULT_SUBJECT: default}
    for name, seconds in value.items():
        found[_alert_name(name, where)] = _alert_seconds(seconds, f"{where}[{name!r}]")
    return found


def _alert_name(name: Any, where: str) -> str:
    if not isinstance(name, str) or not name or len(name) > 255:
        raise ImproperlyConfigured(
            f"{where}: a key must be a name of 1 to 255 characters, not {name!r}"
        )
    return name


def _alert_seconds(value: Any, where: str, *, positive: bool = False) -> float:
    """A threshold in seconds: a duration (:func:`parse_duration`), or ``None`` for never
    (``inf``)."""
    if value is None:
        return float("inf")
    if isinstance(value, bool):
        raise ImproperlyConfigured(f"{where}: expected a duration or None, not {value!r}")
    try:
        seconds = parse_duration(value).total_seconds()
    except (ValueError, OverflowError) as exc:
        raise ImproperlyConfigured(f"{where}: {exc}") from None
    if positive and seconds <= 0:
        raise ImproperlyConfigured(f"{where}: must be longer than 0 seconds, not {value!r}")
    return seconds
