"""What the admin's dashboard page shows, read from the same SQL views as the Grafana dashboard
(through :mod:`django_jobs.store.operations_views`)."""

from __future__ import annotations

from collections import defaultdict
from datetime import date, datetime, timedelta
from typing import Any

from django.db import DatabaseError
from django.db.models import F
from django.db.models.functions import Now
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from django_jobs import conf, rollups
from django_jobs.exceptions import JobsError
from django_jobs.models.job import Job
from django_jobs.progress import Shown, count
from django_jobs.sanitize import mask_text
from django_jobs.store import diagnosis
from django_jobs.store import operations_views as stats

WINDOW_MINUTES = 60
#: The days of the task statistics (from the hourly rollups).
TASK_DAYS = 7
#: At most this many tasks, those that ended the most jobs.
TASKS = 50
REFRESH_SECONDS = 10
STUCK_REASONS = {
    "past_timeout": "running past its timeout",
    "worker_dead": "its worker is gone",
    "late_pending": "ready but not claimed for long",
}


def context() -> dict[str, Any]:
    """What the dashboard shows, read from ``JOBS_READ_DATABASE``. When that is not
    ``JOBS_DATABASE`` and fails (away, too slow, not migrated), from ``JOBS_DATABASE``
    instead, with ``read_problem`` saying so for the page's banner."""
    alias = stats.read_alias()
    primary = conf.database_alias()
    try:
        return _context(alias)
    except DatabaseError as error:
        if alias == primary:
            raise
        problem = (
            str(error)
            if isinstance(error, JobsError)
            else f"the read database {diagnosis.where(alias)} failed: "
            f"{type(error).__name__}: {diagnosis.first_line(error)}"
        )
        return {
            **_context(primary),
            "read_problem": f"{problem}. Showing the primary database {primary!r} instead.",
        }


def _context(alias: str) -> dict[str, Any]:
    summary = stats.summary(window_minutes=WINDOW_MINUTES, using=alias)
    queues = []
    for queue in summary["queues"]:
        rate = queue["failure_rate"]
        queues.append(
            {
                **queue,
                "oldest_ready_age": stats.format_age(queue["oldest_ready_age_seconds"]) or "-",
                "failure_rate_percent": "-" if rate is None else f"{rate:.1%}",
            }
        )
    minutes = stats.throughput(WINDOW_MINUTES, using=alias)
    per_minute: dict[Any, list[int]] = defaultdict(lambda: [0, 0])
    per_task: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for row in minutes:
        per_minute[row["minute"]][0] += row["done"]
        per_minute[row["minute"]][1] += row["failed"]
        per_task[row["task"]][0] += row["done"]
        per_task[row["task"]][1] += row["failed"]
    failing = [
        {"task": task, "done": done, "failed": failed, "rate": f"{failed / (done + failed):.1%}"}
        for task, (done, failed) in sorted(per_task.items(), key=lambda kv: -kv[1][1])
        if failed
    ][:10]
    workers = [
        {**w, "seen_ago": stats.format_age(w["seen_seconds_ago"]) or "0s"}
        for w in stats.workers(using=alias)
    ]
    running_jobs = (
        Job.objects.using(alias)
        .filter(state=Job.State.RUNNING)
        .annotate(running_for=Now() - F("started_at"))
        .only(
            "id",
            "task",
            "queue",
            "attempt",
            "max_attempts",
            "worker_id",
            "timeout",
            "cancel_requested",
            "started_at",
            "progress_done",
            "progress_total",
            "progress_attempt",
        )
        .order_by("started_at")[:50]
    )
    with stats.reading(alias):  # bounded by the statement timeout of the reads
        running = [
            (
                job,
                stats.format_age(job.running_for.total_seconds()),
                progress_bar(job.progress) if job.progress else "",
            )
            for job in running_jobs
        ]
    stuck = [
        {
            **s,
            "reason_text": STUCK_REASONS.get(s["reason"], s["reason"]),
            "age": stats.format_age(s["age_seconds"]),
        }
        for s in stats.stuck_jobs(limit=20, using=alias)
    ]
    failures = [
        {**f, "error_text": mask_text(f["error"] or "")[:300]}
        for f in stats.recent_failures(limit=15, using=alias)
    ]
    tasks = [_task_row(t) for t in rollups.task_statistics(TASK_DAYS, TASKS, using=alias)]
    return {
        "summary": summary,
        "queues": queues,
        "stuck_total": sum(summary["stuck"].values()),
        "chart": chart(sorted(per_minute.items()), summary["generated_at"]),
        "hour_done": sum(v[0] for v in per_minute.values()),
        "hour_failed": sum(v[1] for v in per_minute.values()),
        "workers": workers,
        "failing": failing,
        "running": running,
        "stuck": stuck,
        "failures": failures,
        "tasks": tasks,
        "task_days": TASK_DAYS,
        "task_limit": TASKS,
        "refresh_seconds": REFRESH_SECONDS,
        "read_problem": "",
    }


def chart(points: list[tuple[Any, list[int]]], now: datetime) -> SafeString:
    """An inline SVG of done (green) and failed (red) attempts per minute over the last
    ``WINDOW_MINUTES`` minutes up to ``now``, stacked, one slot per minute."""
    width, height = 600, 100
    if not points:
        return format_html('<p class="dj-muted">{}</p>', "No attempt ended in the last hour.")
    peak = max(done + failed for _, (done, failed) in points) or 1
    step = width / WINDOW_MINUTES
    start = now - timedelta(minutes=WINDOW_MINUTES)
    bars = []
    for minute, (done, failed) in points:
        slot = min(WINDOW_MINUTES - 1, max(0, int((minute - start).total_seconds() // 60)))
        x = slot * step
        done_h = height * done / peak
        failed_h = height * failed / peak
        label = f"{minute:%H:%M}: {done} done, {failed} failed"
        bars.append((x, height - done_h, step * 0.8, done_h, label, "done"))
        bars.append((x, height - done_h - failed_h, step * 0.8, failed_h, label, "failed"))
    rects = format_html_join(
        "",
        '<rect x="{}" y="{}" width="{}" height="{}" class="{}"><title>{}</title></rect>',
        (
            (f"{x:.1f}", f"{y:.1f}", f"{w:.1f}", f"{h:.1f}", css, label)
            for x, y, w, h, label, css in bars
        ),
    )
    return format_html(
        '<svg viewBox="0 0 {} {}" preserveAspectRatio="none">{}'
        '<line x1="0" y1="{}" x2="{}" y2="{}" class="axis"/></svg>',
        width,
        height,
        rects,
        height,
        width,
        height,
    )


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 10:
        return f"{value:.2f}s"
    return stats.format_age(value) or f"{value:.0f}s"


def _task_row(t: rollups.TaskStatistics) -> dict[str, Any]:
    rate = t.failure_rate
    return {
        "task": t.task,
        "jobs": count(t.jobs),
        "failed": t.failed,
        "cancelled": t.cancelled,
        "attempts": count(t.attempts),
        "failed_attempts": t.failed_attempts,
        "failure_rate": "-" if rate is None else f"{rate:.1%}",
        "p50": _seconds(t.p50_seconds),
        "p95": _seconds(t.p95_seconds),
        "mean": _seconds(t.mean_seconds),
        "trend": trend(t.daily),
    }


def trend(daily: list[tuple[date, int, int]]) -> SafeString:
    """An inline SVG of jobs ended per day (failed in red on top of the rest), oldest first."""
    width, height, gap = 84, 20, 2
    peak = max((jobs for _, jobs, _ in daily), default=0) or 1
    step = width / max(len(daily), 1)
    rects = []
    for i, (day, jobs, failed) in enumerate(daily):
        x = i * step
        all_h = height * jobs / peak
        failed_h = height * failed / peak
        label = f"{day:%a %d %b}: {jobs} ended, {failed} failed"
        rects.append((x, height - all_h, step - gap, all_h - failed_h, "done", label))
        rects.append((x, height - failed_h, step - gap, failed_h, "failed", label))
    bars = format_html_join(
        "",
        '<rect x="{}" y="{}" width="{}" height="{}" class="{}"><title>{}</title></rect>',
        (
            (f"{x:.1f}", f"{y:.1f}", f"{w:.1f}", f"{h:.1f}", css, label)
            for x, y, w, h, css, label in rects
        ),
    )
    return format_html(
        '<svg class="dj-trend" viewBox="0 0 {} {}" width="{}" height="{}" role="img" '
        'aria-label="jobs ended per day, last {} days">{}</svg>',
        width,
        height,
        width,
        height,
        len(daily),
        bars,
    )


def progress_bar(shown: Shown) -> SafeString:
    """A compact bar with its percentage, or the count done when the total is unknown."""
    fraction = shown.fraction
    if fraction is None:
        return format_html('<span class="dj-progress-count">{} done</span>', count(shown.done))
    return format_html(
        '<span class="dj-progress" title="{} of {}"><span class="dj-progress-bar">'
        '<span style="width: {}%"></span></span> {}</span>',
        count(shown.done),
        count(shown.total or 0),
        f"{100 * fraction:.1f}",
        shown.percent,
    )
