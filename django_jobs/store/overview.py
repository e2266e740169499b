"""What the admin's dashboard page shows, read from the same SQL views as the Grafana dashboard
(through :mod:`django_jobs.store.operations_views`)."""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta
from typing import Any

from django.db import DatabaseError
from django.db.models import F
from django.db.models.functions import Now
from django.utils import timezone
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


def context(range_key: str | None = None) -> dict[str, Any]:
    """What the dashboard shows, read from ``JOBS_READ_DATABASE``. When that is not
    ``JOBS_DATABASE`` and fails (away, too slow, not migrated), from ``JOBS_DATABASE``
    instead, with ``read_problem`` saying so for the page's banner."""
    alias = stats.read_alias()
    primary = conf.database_alias()
    try:
        return _context(alias, chosen_range(range_key))
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
            **_context(primary, chosen_range(range_key)),
            "read_problem": f"{problem}. Showing the primary database {primary!r} instead.",
        }


def queue_rows(summary: stats.Summary) -> list[dict[str, Any]]:
    """The queues of ``summary`` as the queues table shows them."""
    rows = []
    for queue in summary["queues"]:
        rate = queue["failure_rate"]
        rows.append(
            {
                **queue,
                "oldest_ready_age": stats.format_age(queue["oldest_ready_age_seconds"]) or "-",
                "failure_rate_percent": "-" if rate is None else f"{rate:.1%}",
            }
        )
    return rows


def _context(alias: str, span: Range) -> dict[str, Any]:
    summary = stats.summary(window_minutes=WINDOW_MINUTES, using=alias)
    queues = queue_rows(summary)
    minutes = stats.throughput(WINDOW_MINUTES, using=alias)
    per_task: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for row in minutes:
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
    points = series(span, summary["generated_at"], minutes, using=alias)
    tasks = [_task_row(t) for t in rollups.task_statistics(TASK_DAYS, TASKS, using=alias)]
    return {
        "summary": summary,
        "queues": queues,
        "stuck_total": sum(summary["stuck"].values()),
        "chart": chart(points, span),
        "range": span,
        "ranges": list(RANGES.values()),
        "range_done": sum(done for _, done, _ in points),
        "range_failed": sum(failed for _, _, failed in points),
        "time_zone": timezone.get_current_timezone_name(),
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


@dataclasses.dataclass(frozen=True)
class Range:
    """A span the dashboard's chart covers: ``slots`` bars of ``step`` each."""

    key: str
    label: str
    step: timedelta
    slots: int
    #: How the x axis names a tick, and which slots get one.
    tick_format: str
    tick_every: Callable[[datetime], bool]

    @property
    def unit(self) -> str:
        return "minute" if self.step == timedelta(minutes=1) else "hour"


RANGES = {
    r.key: r
    for r in (
        Range(
            "1h", "1 h", timedelta(minutes=1), WINDOW_MINUTES, "%H:%M", lambda t: t.minute % 10 == 0
        ),
        Range("24h", "24 h", timedelta(hours=1), 24, "%H:%M", lambda t: t.hour % 3 == 0),
        Range("7d", "7 d", timedelta(hours=1), 24 * 7, "%a %d %b", lambda t: t.hour == 0),
    )
}
DEFAULT_RANGE = "24h"


def chosen_range(value: str | None) -> Range:
    """The range named by the page's ``?range=`` (1h, 24h, 7d); anything else is the default."""
    return RANGES.get(value or "", RANGES[DEFAULT_RANGE])


def series(
    span: Range, now: datetime, minutes: list[dict[str, Any]], using: str | None = None
) -> list[tuple[datetime, int, int]]:
    """Attempts (done, failed) ended in each slot of ``span`` up to ``now``, oldest first: per
    minute from ``minutes``, the page's rows of ``django_jobs_throughput`` for its last
    :data:`WINDOW_MINUTES`, for the last hour; per hour from the rollups (and the attempts of
    the hours not rolled up yet) otherwise."""
    step = span.step
    epoch = datetime(2000, 1, 1, tzinfo=UTC)
    last = now - (now - epoch) % step
    starts = [last - step * (span.slots - 1 - i) for i in range(span.slots)]
    counts: dict[datetime, tuple[int, int]] = {}
    if span.unit == "minute":
        for row in minutes:
            done, failed = counts.get(row["minute"], (0, 0))
            counts[row["minute"]] = (done + row["done"], failed + row["failed"])
    else:
        counts = rollups.hourly_attempts(starts[0], now, using=using)
    return [(start, *counts.get(start, (0, 0))) for start in starts]


def _nice_ceiling(value: int) -> int:
    """The top of the y axis: four gridline steps of 1, 2 or 5 times a power of ten, together
    at least ``value``."""
    needed = max(value, 1) / 4
    magnitude = 1
    while True:
        for factor in (1, 2, 5):
            if factor * magnitude >= needed:
                return 4 * factor * magnitude
        magnitude *= 10


def chart(points: list[tuple[datetime, int, int]], span: Range) -> SafeString:
    """An inline SVG of attempts done (green) and failed (red) per slot of ``span``, stacked,
    with a y axis in attempts per minute or hour, gridlines, and the x axis in local time."""
    width, height, left, right, top, bottom = 960, 220, 56, 12, 12, 30
    plot_w, plot_h = width - left - right, height - top - bottom
    ceiling = _nice_ceiling(max((done + failed for _, done, failed in points), default=0))
    step = plot_w / max(len(points), 1)
    parts: list[SafeString] = []
    for i in range(5):  # gridlines and y labels at 0, 1/4 ... the top
        value = ceiling * i // 4
        y = top + plot_h - plot_h * i / 4
        parts.append(
            format_html(
                '<line x1="{}" y1="{}" x2="{}" y2="{}" class="grid"/>'
                '<text x="{}" y="{}" class="y-label">{}</text>',
                left,
                _n(y),
                width - right,
                _n(y),
                left - 6,
                _n(y + 4),
                count(value),
            )
        )
    for i, (start, done, failed) in enumerate(points):
        x = left + i * step
        done_h = plot_h * done / ceiling
        failed_h = plot_h * failed / ceiling
        local = timezone.localtime(start)
        label = f"{local:%a %d %b %H:%M}: {done} done, {failed} failed"
        for y, h, css in (
            (top + plot_h - done_h, done_h, "done"),
            (top + plot_h - done_h - failed_h, failed_h, "failed"),
        ):
            if h:
                parts.append(
                    format_html(
                        '<rect x="{}" y="{}" width="{}" height="{}" class="{}">'
                        "<title>{}</title></rect>",
                        _n(x),
                        _n(y),
                        _n(max(step * 0.8, 0.5)),
                        _n(h),
                        css,
                        label,
                    )
                )
        if span.tick_every(local):
            parts.append(
                format_html(
                    '<line x1="{}" y1="{}" x2="{}" y2="{}" class="tick"/>'
                    '<text x="{}" y="{}" class="x-label">{}</text>',
                    _n(x),
                    top + plot_h,
                    _n(x),
                    top + plot_h + 4,
                    _n(x),
                    height - 10,
                    local.strftime(span.tick_format),
                )
            )
    unit = f"attempts per {span.unit}"
    return format_html(
        '<svg class="dj-throughput" viewBox="0 0 {} {}" role="img" aria-label="{}, last {}">'
        '<text x="12" y="{}" class="y-unit" transform="rotate(-90 12 {})">{}</text>{}'
        '<line x1="{}" y1="{}" x2="{}" y2="{}" class="axis"/>'
        '<line x1="{}" y1="{}" x2="{}" y2="{}" class="axis"/></svg>',
        width, height, unit, span.label,
        top + plot_h // 2, top + plot_h // 2, unit, SafeString("".join(parts)),
        left, top, left, top + plot_h,
        left, top + plot_h, width - right, top + plot_h,
    )  # fmt: skip


def _n(value: float) -> str:
    return f"{value:.1f}"


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
