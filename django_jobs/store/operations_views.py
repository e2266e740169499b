"""Operations data: what is queued, running, finishing and failing, per queue.

Everything here reads the SQL views of migrations 0003, 0012 and 0014, the public contract
that Grafana also queries (see docs/operations.md), so the terminal, the admin and the
dashboards agree. The functions return plain data (lists and dicts of numbers, strings and
datetimes) for ``manage.py jobstats`` and any other caller; :func:`render` and :func:`to_json`
format a :func:`summary` for people and for scripts.

They read from ``JOBS_READ_DATABASE`` (a replica, say; default: ``JOBS_DATABASE``), with a
connect timeout (``JOBS_READ_CONNECT_TIMEOUT``) and a statement timeout
(``JOBS_STATEMENT_TIMEOUT_MS``), except the queue controls of :func:`summary`, which are always
read from ``JOBS_DATABASE``: a replica that lags must not show a queue just paused as open. The
views judge workers dead and jobs overdue by the thresholds in the session settings
``django_jobs.worker_timeout`` and ``django_jobs.timeout_grace``; these functions set them from
``JOBS_WORKER_TIMEOUT`` and ``JOBS_TIMEOUT_GRACE`` for their own transaction. The statements are
in django_jobs/store/sql/stats.sql, and run with the bounded waits of db.py.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from datetime import datetime
from typing import Any, TypedDict

from django.db import connections, transaction

from django_jobs import conf
from django_jobs.cursor import Cursor
from django_jobs.exceptions import InvalidOption
from django_jobs.progress import count
from django_jobs.registry import registry
from django_jobs.sanitize import mask_text
from django_jobs.store import db, diagnosis
from django_jobs.store.sql import query


class QueueSummary(TypedDict):
    queue: str
    waiting: int
    pending: int
    #: Pending jobs whose run_after has passed, and those scheduled for later.
    ready: int
    scheduled: int
    running: int
    #: Seconds the oldest ready job has waited since its run_after; None if none is ready.
    oldest_ready_age_seconds: float | None
    #: Seconds the longest-running job has been running; None if none runs.
    oldest_running_age_seconds: float | None
    #: Attempts that ended in the window, by outcome (failed: states.FAILED_OUTCOMES).
    done: int
    failed: int
    cancelled: int
    #: Jobs cancelled in the window because their deadline (``expires_after``, ``expires_at``)
    #: passed before they, or their retry, started; no attempt of theirs counts above.
    expired: int
    done_per_minute: float
    #: failed / (done + failed) in the window; None when no attempt ended.
    failure_rate: float | None
    #: Live workers that serve this queue (those serving every queue included).
    workers_alive: int
    #: Jobs of this queue in the django_jobs_stuck_jobs view.
    stuck: int
    #: The queue's controls (queues/controls.py): paused (by whom, when, why) and its limit
    #: (None: none).
    paused: bool
    paused_by: str
    paused_at: datetime | None
    pause_reason: str
    concurrency_limit: int | None


class WorkersSummary(TypedDict):
    alive: int
    dead: int
    #: Executor slots (concurrency) of the live workers, and how many of them run a job.
    slots: int
    running_jobs: int


class Summary(TypedDict):
    generated_at: datetime
    window_minutes: int
    queues: list[QueueSummary]
    workers: WorkersSummary
    #: Stuck jobs by reason: past_timeout, worker_dead, late_pending.
    stuck: dict[str, int]
    #: Rows of the django_jobs_schedules view: the periodic jobs, by name.
    schedules: list[dict[str, Any]]
    #: Rows of the django_jobs_running view that reported progress, the longest running first.
    running: list[dict[str, Any]]


def read_alias(using: str | None = None) -> str:
    """The alias these reads use: ``using``, else ``JOBS_READ_DATABASE``. A read database other
    than ``JOBS_DATABASE`` gets ``JOBS_READ_CONNECT_TIMEOUT``, unless its ``OPTIONS`` set a
    ``connect_timeout``: a replica that is away must not hang the dashboard."""
    alias = using or conf.read_database_alias()
    if alias != conf.database_alias():
        _bound_connect(alias)
    return alias


def _bound_connect(alias: str) -> None:
    # This thread's connection object of the alias gets settings of its own, with the timeout;
    # DATABASES, and so the user's other connections to the alias, stay as they are.
    wrapper = connections[alias]
    options = getattr(wrapper, "_django_jobs_options", None)
    if options is None:
        options = dict(wrapper.settings_dict.get("OPTIONS") or {})
        wrapper._django_jobs_options = options  # type: ignore[attr-defined]
    if "connect_timeout" in options:
        return
    timeout = conf.read_connect_timeout()
    if wrapper.settings_dict.get("OPTIONS", {}).get("connect_timeout") != timeout:
        wrapper.settings_dict = {
            **wrapper.settings_dict,
            "OPTIONS": {**options, "connect_timeout": timeout},
        }


def _what(alias: str) -> str:
    return "database" if alias == conf.database_alias() else "read database"


@contextlib.contextmanager
def reading(using: str | None = None) -> Iterator[Any]:
    """A cursor in a transaction on :func:`read_alias`, whose every statement (the ORM's too)
    is bounded by ``JOBS_STATEMENT_TIMEOUT_MS``. A database that is away or not
    migrated raises :class:`~django_jobs.exceptions.DatabaseUnreachable` or
    :class:`~django_jobs.exceptions.JobTablesMissing`, whose message names it."""
    alias = read_alias(using)
    with (
        diagnosis.translated(alias, _what(alias), waits=True),
        transaction.atomic(using=alias),
        connections[alias].cursor() as cursor,
    ):
        # For the whole transaction: db.execute bounds its own statements, and puts this back.
        cursor.execute(query("bound_reads"), {"ms": str(conf.statement_timeout_ms())})
        thresholds = {
            "worker_timeout": str(conf.worker_timeout()),
            "timeout_grace": str(conf.timeout_grace()),
        }
        db.execute(cursor, query("view_thresholds"), thresholds)
        yield cursor


def _rows(cursor: Cursor, name: str, params: Any = None) -> list[dict[str, Any]]:
    """The rows of the statement ``name`` of stats.sql, as dicts; run with db.py's bounded
    waits (and without JIT, which would cost more than these small index reads)."""
    result = db.execute(cursor, query(name), params)
    names = [column[0] for column in result.description]
    return [dict(zip(names, row, strict=True)) for row in result.fetchall()]


def queue_summary(using: str | None = None) -> list[dict[str, Any]]:
    """Rows of ``django_jobs_queue_summary``: unfinished jobs per queue and state."""
    with reading(using) as cursor:
        return _rows(cursor, "queue_summary")


def throughput(minutes: int = 15, using: str | None = None) -> list[dict[str, Any]]:
    """Rows of ``django_jobs_throughput`` for the last ``minutes`` minutes, oldest first."""
    with reading(using) as cursor:
        return _rows(cursor, "throughput", {"minutes": minutes})


def task_durations(using: str | None = None) -> list[dict[str, Any]]:
    """Rows of ``django_jobs_task_durations``: p50/p95/max run time per task, last hour."""
    with reading(using) as cursor:
        return _rows(cursor, "task_durations")


def workers(using: str | None = None) -> list[dict[str, Any]]:
    """Rows of ``django_jobs_workers``: every registered worker, alive or not."""
    with reading(using) as cursor:
        rows = _rows(cursor, "workers")
    for row in rows:
        if isinstance(row["queues"], str):
            row["queues"] = json.loads(row["queues"])
    return rows


def stuck_jobs(limit: int = 100, using: str | None = None) -> list[dict[str, Any]]:
    """Rows of ``django_jobs_stuck_jobs``, the longest stuck first."""
    with reading(using) as cursor:
        return _rows(cursor, "stuck_jobs", {"limit": limit})


def recent_failures(limit: int = 50, using: str | None = None) -> list[dict[str, Any]]:
    """Rows of ``django_jobs_recent_failures``, newest first."""
    with reading(using) as cursor:
        return _rows(cursor, "recent_failures", {"limit": limit})


def running(limit: int = 100, using: str | None = None) -> list[dict[str, Any]]:
    """Rows of ``django_jobs_running``: the running jobs with their progress, the longest
    running first."""
    with reading(using) as cursor:
        return _rows(cursor, "running", {"limit": limit})


def summary(window_minutes: int = 15, using: str | None = None) -> Summary:
    """Per queue: jobs by state, the oldest ready and running ages, attempts ended in the last
    ``window_minutes``, live workers, stuck jobs; plus the worker and stuck totals."""
    if window_minutes < 1:
        raise InvalidOption("window_minutes must be at least 1")
    with reading(using) as cursor:
        generated_at = _rows(cursor, "summary_clock")[0]["generated_at"]
        states = _rows(cursor, "summary_states")
        ended = _rows(cursor, "summary_ended", {"minutes": window_minutes})
        expired = _rows(cursor, "summary_expired", {"minutes": window_minutes})
        stuck = _rows(cursor, "summary_stuck")
        registered = _rows(cursor, "summary_workers")
        schedules = _rows(cursor, "summary_schedules")
        progress = _rows(cursor, "summary_progress")
    controls = _controls(using)

    for worker in registered:
        if isinstance(worker["queues"], str):
            worker["queues"] = json.loads(worker["queues"])
    names = set(registry.queues())
    names.update(row["queue"] for row in states + ended + expired + stuck)
    if controls is not None:
        names.update(q for q, c in controls.items() if c["paused"] or c["concurrency_limit"])
    queues: dict[str, QueueSummary] = {name: _empty_queue(name) for name in sorted(names)}

    for row in states:
        queue = queues[row["queue"]]
        queue["paused"], queue["paused_by"], queue["paused_at"] = (
            row["paused"],
            row["paused_by"],
            row["paused_at"],
        )
        queue["pause_reason"], queue["concurrency_limit"] = (
            row["pause_reason"],
            row["concurrency_limit"],
        )
        if row["state"] == "pending":
            queue["pending"] = row["jobs"]
            queue["ready"] = row["ready"]
            queue["scheduled"] = row["scheduled"]
            queue["oldest_ready_age_seconds"] = row["oldest_age_seconds"]
        elif row["state"] == "running":
            queue["running"] = row["jobs"]
            queue["oldest_running_age_seconds"] = row["oldest_age_seconds"]
        elif row["state"] == "waiting":
            queue["waiting"] = row["jobs"]
    if controls is not None:
        for name, queue in queues.items():
            control = controls.get(name) or _OPEN
            queue["paused"], queue["paused_by"], queue["paused_at"] = (
                control["paused"],
                control["paused_by"],
                control["paused_at"],
            )
            queue["pause_reason"] = control["pause_reason"]
            queue["concurrency_limit"] = control["concurrency_limit"]
    for row in ended:
        queue = queues[row["queue"]]
        queue["done"], queue["failed"], queue["cancelled"] = (
            row["done"],
            row["failed"],
            row["cancelled"],
        )
        queue["done_per_minute"] = round(row["done"] / window_minutes, 3)
        if row["done"] + row["failed"]:
            queue["failure_rate"] = round(row["failed"] / (row["done"] + row["failed"]), 4)
    for row in expired:
        queues[row["queue"]]["expired"] = row["expired"]
    for row in stuck:
        queues[row["queue"]]["stuck"] += row["jobs"]
    for queue in queues.values():
        queue["workers_alive"] = sum(
            1
            for w in registered
            if w["alive"] and (not w["queues"] or queue["queue"] in w["queues"])
        )

    alive = [w for w in registered if w["alive"]]
    by_reason: dict[str, int] = {}
    for row in stuck:
        by_reason[row["reason"]] = by_reason.get(row["reason"], 0) + row["jobs"]
    return Summary(
        generated_at=generated_at,
        window_minutes=window_minutes,
        queues=list(queues.values()),
        workers=WorkersSummary(
            alive=len(alive),
            dead=len(registered) - len(alive),
            slots=sum(w["concurrency"] for w in alive),
            running_jobs=sum(w["running_jobs"] for w in alive),
        ),
        stuck=dict(sorted(by_reason.items())),
        schedules=schedules,
        running=progress,
    )


_OPEN: dict[str, Any] = {
    "paused": False,
    "paused_by": "",
    "paused_at": None,
    "pause_reason": "",
    "concurrency_limit": None,
}


def _controls(using: str | None) -> dict[str, dict[str, Any]] | None:
    """The queue controls by queue, read from ``JOBS_DATABASE`` when the other reads are not:
    pause state and limits are never read from a replica that may lag. ``None`` when the
    reads are on ``JOBS_DATABASE`` already (the views hold the controls)."""
    primary = conf.database_alias()
    if read_alias(using) == primary:
        return None
    with diagnosis.translated(primary), connections[primary].cursor() as cursor:
        return {row["queue"]: row for row in _rows(cursor, "queue_controls")}


def _empty_queue(name: str) -> QueueSummary:
    return QueueSummary(
        queue=name,
        waiting=0,
        pending=0,
        ready=0,
        scheduled=0,
        running=0,
        oldest_ready_age_seconds=None,
        oldest_running_age_seconds=None,
        done=0,
        failed=0,
        cancelled=0,
        expired=0,
        done_per_minute=0.0,
        failure_rate=None,
        workers_alive=0,
        stuck=0,
        paused=False,
        paused_by="",
        paused_at=None,
        pause_reason="",
        concurrency_limit=None,
    )


def format_age(seconds: float | None) -> str:
    """``"45s"``, ``"4m12s"``, ``"3h05m"``, ``"2d04h"``; empty for ``None``."""
    if seconds is None:
        return ""
    whole = max(0, int(seconds))
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    if whole < 86400:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d{whole % 86400 // 3600:02d}h"


def render(data: Summary) -> str:
    """The summary as text: a header line, then a small table per queue."""
    workers = data["workers"]
    stuck_total = sum(data["stuck"].values())
    lines = [
        f"django-jobs at {data['generated_at']:%Y-%m-%d %H:%M:%S %Z} · rates over the last "
        f"{data['window_minutes']} min · workers: {workers['alive']} alive "
        f"({workers['running_jobs']}/{workers['slots']} slots busy), {workers['dead']} dead"
        + (
            " · stuck: " + ", ".join(f"{n} {reason}" for reason, n in data["stuck"].items())
            if stuck_total
            else ""
        ),
    ]
    for q in data["queues"]:
        rate = "" if q["failure_rate"] is None else f" · {q['failure_rate']:.1%} failed"
        lines += [
            "",
            f"{q['queue']} · {q['workers_alive']} worker(s) alive · "
            f"{q['done_per_minute']:.1f} done/min ({q['done']} done, {q['failed']} failed, "
            f"{q['cancelled']} cancelled){rate}"
            + (f" · {q['expired']} expired" if q["expired"] else "")
            + (f" · {q['stuck']} stuck" if q["stuck"] else ""),
            *_control_lines(q),
            f"  {'state':<9} {'jobs':>8} {'ready':>8} {'scheduled':>10} {'oldest':>8}",
            f"  {'waiting':<9} {q['waiting']:>8}",
            f"  {'pending':<9} {q['pending']:>8} {q['ready']:>8} {q['scheduled']:>10} "
            f"{format_age(q['oldest_ready_age_seconds']):>8}",
            f"  {'running':<9} {q['running']:>8} {'':>8} {'':>10} "
            f"{format_age(q['oldest_running_age_seconds']):>8}"
            + (f"  (limit {q['concurrency_limit']})" if q["concurrency_limit"] else ""),
        ]
    lines += _schedule_lines(data["schedules"]) + _progress_lines(data["running"])
    return "\n".join(line.rstrip() for line in lines)


def _control_lines(q: QueueSummary) -> list[str]:
    """A paused queue's line in :func:`render`: who paused it, when and why."""
    if not q["paused"]:
        return []
    when = f" at {q['paused_at']:%Y-%m-%d %H:%M:%S %Z}" if q["paused_at"] else ""
    reason = f": {q['pause_reason']}" if q["pause_reason"] else ""
    return [f"  PAUSED by {q['paused_by'] or '?'}{when}{reason}"]


def _schedule_lines(schedules: list[dict[str, Any]]) -> list[str]:
    """The schedules section of :func:`render`: one line per periodic job."""
    if not schedules:
        return []
    late = sum(1 for s in schedules if s["late_seconds"] > 60)
    paused = sum(1 for s in schedules if s["paused"])
    lines = [
        "",
        f"schedules · {len(schedules)} ({paused} paused, {late} late by over a minute)",
        f"  {'name':<24} {'expression':<16} {'next run (UTC)':<16} {'late':>6}  last outcome",
    ]
    for s in schedules:
        state = " paused" if s["paused"] else (" removed" if s["removed_from_code"] else "")
        next_run = f"{s['next_run_at']:%m-%d %H:%M}" if s["next_run_at"] else "-"
        lines.append(
            f"  {s['name'][:24]:<24} {s['expression'][:16]:<16} {next_run:<16} "
            f"{format_age(s['late_seconds'] or None):>6}  {s['last_outcome']}{state}"
        )
    return lines


def _progress_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The progress section of :func:`render`: one line per running job that reported some."""
    if not rows:
        return []
    lines = [
        "",
        f"progress · {len(rows)} running job(s) reporting it",
        f"  {'job':>8} {'task':<32} {'done':>14} {'%':>6} {'left':>8}  message",
    ]
    for row in rows:
        done = count(row["progress_done"])
        if row["progress_total"] is not None:
            done += f"/{count(row['progress_total'])}"
        percent = "" if row["progress_percent"] is None else f"{row['progress_percent']:.0f}%"
        lines.append(
            f"  {row['job_id']:>8} {row['task'][:32]:<32} {done:>14} {percent:>6} "
            f"{format_age(row['eta_seconds']):>8}  {mask_text(row['progress_message'])[:60]}"
        )
    return lines


def to_json(data: Summary) -> str:
    """The summary as one line of JSON (datetimes in ISO 8601)."""
    return json.dumps(data, default=lambda value: value.isoformat(), sort_keys=False)
