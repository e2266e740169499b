"""System checks (``manage.py check``): a database the job system cannot run on correctly is
reported at deploy time, instead of weakening a guarantee silently at run time."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured

from django_jobs import alerts, conf, queues
from django_jobs.exceptions import InvalidOption
from django_jobs.registry import registry
from django_jobs.schedules import declarations


@checks.register(checks.Tags.database, checks.Tags.compatibility)
def check_jobs_database(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    alias = conf.database_alias()
    if alias not in settings.DATABASES:
        return [
            checks.Error(
                f"JOBS_DATABASE is {alias!r}, which DATABASES does not define.",
                hint="Set JOBS_DATABASE to the alias of the PostgreSQL database of the job tables.",
                id="django_jobs.E001",
            )
        ]
    engine = str(settings.DATABASES[alias].get("ENGINE", ""))
    if "postgresql" not in engine and "postgis" not in engine:
        return [
            checks.Error(
                f"The job tables' database {alias!r} uses {engine!r}; django-jobs runs on "
                "PostgreSQL only (13 or newer).",
                hint="Point JOBS_DATABASE at a database with ENGINE django.db.backends.postgresql.",
                id="django_jobs.E002",
            )
        ]
    from django.db.backends.postgresql.psycopg_any import is_psycopg3

    if not is_psycopg3:
        return [
            checks.Error(
                "Django's PostgreSQL backend is using psycopg2; django-jobs needs psycopg 3, "
                "which its statements rely on to run with bounded lock waits, durable commits "
                "and one transaction each.",
                hint="pip install 'psycopg[binary]>=3.1' (Django prefers it to psycopg2).",
                id="django_jobs.E003",
            )
        ]
    return []


@checks.register()
def check_queue_limits(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """``JOBS_QUEUE_LIMITS`` must map queue names to whole numbers from 1."""
    try:
        queues.check_limits(conf.queue_limits())
    except InvalidOption as error:
        return [
            checks.Error(
                f"JOBS_QUEUE_LIMITS is invalid: {error}",
                hint="Write it as {'gpu': 4}: queue name to the most jobs it may run at once.",
                id="django_jobs.E005",
            )
        ]
    return []


@checks.register()
def check_time_controls(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """``JOBS_QUEUE_RATE_LIMITS`` must map queue names to rates (``"100/m"``), and
    ``JOBS_FAIR_QUEUES`` list queue names; each a queue that some task uses, or the default."""
    found: list[checks.CheckMessage] = []
    try:
        rates = queues.check_rates(conf.queue_rate_limits())
    except InvalidOption as error:
        found.append(
            checks.Error(
                f"JOBS_QUEUE_RATE_LIMITS is invalid: {error}",
                hint="Write it as {'emails': '100/m'}: queue name to the most starts per window"
                " ('10/s', '100/m', '1000/h', '10/2s', '5/30m').",
                id="django_jobs.E010",
            )
        )
        rates = {}
    try:
        fair = queues.check_fair(conf.fair_queues())
    except InvalidOption as error:
        found.append(
            checks.Error(
                f"JOBS_FAIR_QUEUES is invalid: {error}",
                hint="Write it as ['imports']: the queues to claim round-robin across their keys.",
                id="django_jobs.E010",
            )
        )
        fair = []
    known = {conf.default_queue(), *registry.queues(), *(conf.queues() or [])}
    limits = conf.queue_limits()
    if isinstance(limits, dict):
        known.update(limits)
    for setting, names in (("JOBS_QUEUE_RATE_LIMITS", rates), ("JOBS_FAIR_QUEUES", fair)):
        for name in names:
            if name not in known:
                found.append(
                    checks.Error(
                        f"{setting} names the queue {name!r}, which no task uses.",
                        hint=f"Use one of the queues of your tasks ({', '.join(sorted(known))}),"
                        " or give a task that queue with @job(queue=...).",
                        id="django_jobs.E011",
                    )
                )
    return found


@checks.register()
def check_alerts(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """``JOBS_ALERTS`` must be a dict of the documented keys with durations that are not
    negative, and its ``expected_duration`` may only name registered tasks. A worker starts
    anyway, and writes no alert thresholds while the setting is invalid."""
    try:
        unknown = alerts.unknown_tasks()
    except ImproperlyConfigured as error:
        return [
            checks.Error(
                f"JOBS_ALERTS is invalid: {error}",
                hint="See django_jobs.conf.alerts() or docs/operations.md (Alerts) for its keys; "
                "durations are seconds or strings like '10m', and None turns an alert off.",
                id="django_jobs.E006",
            )
        ]
    return [
        checks.Error(
            f"JOBS_ALERTS['expected_duration'] names the task {task!r}, which is not registered:"
            " its threshold would never apply.",
            hint="Use the name of a @job, remote_job() or JOBS_REMOTE_TASKS task (its module "
            "and function name unless it sets name=), or set expected_duration on the @job.",
            id="django_jobs.E007",
        )
        for task in unknown
    ]


@checks.register()
def check_rollups(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """``JOBS_ROLLUP_RETENTION`` must be a duration and ``JOBS_ROLLUP_INTERVAL`` seconds, 0 or
    more."""
    found: list[checks.CheckMessage] = []
    for read in (conf.rollup_retention, conf.rollup_interval):
        try:
            read()
        except ImproperlyConfigured as error:
            found.append(
                checks.Error(
                    str(error),
                    hint="JOBS_ROLLUP_RETENTION: a duration like '400d' or '12w'; "
                    "JOBS_ROLLUP_INTERVAL: seconds between a worker's rollup looks, 0 for none.",
                    id="django_jobs.E008",
                )
            )
    return found


@checks.register()
def check_metrics(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """``JOBS_METRICS_ALLOWED_IPS`` must be a list of addresses or CIDRs and
    ``JOBS_METRICS_TOKENS`` a list of tokens of at least 16 characters."""
    found: list[checks.CheckMessage] = []
    for read in (conf.metrics_allowed_ips, conf.metrics_tokens):
        try:
            read()
        except ImproperlyConfigured as error:
            found.append(
                checks.Error(
                    str(error),
                    hint="See docs/operations.md, Prometheus: JOBS_METRICS_ALLOWED_IPS = "
                    "['10.0.0.0/8'], JOBS_METRICS_TOKENS = [os.environ['METRICS_TOKEN']].",
                    id="django_jobs.E009",
                )
            )
    return found


#: The tag of the periodic jobs' check, which the worker and scheduler commands leave out.
SCHEDULES = "django_jobs_schedules"


@checks.register(SCHEDULES)
def check_schedules(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Every periodic job declared in code (``@job(schedule=...)``, ``JOBS_SCHEDULES``) must be
    one a scheduler can run; one that is not is left out of the sync, never half-written.
    ``manage.py check`` and most commands report it; a worker or scheduler starts anyway (one
    bad schedule must not stop the others, nor the jobs) and logs it (see :func:`but_schedules`)."""

    _, errors = declarations.declared()
    return [
        checks.Error(
            f"A periodic job cannot run: {why}",
            hint="Fix the declaration (cron: 5 fields or @daily/@hourly/...; timezone: an IANA "
            "name; task: a registered @job; args and kwargs: plain JSON). Schedulers skip it.",
            id="django_jobs.E004",
        )
        for name, why in errors.items()
    ]


def but_schedules() -> list[str]:
    """The tags of every registered check but :data:`SCHEDULES`: the checks that the worker and
    scheduler commands run before they start (``requires_system_checks``)."""
    return sorted(set(checks.registry.registry.tags_available()) - {SCHEDULES})
