"""How a job and its attempts read in the admin: state badges, durations, the list's columns,
the job page's fields (payloads masked, related jobs, timeline) and its table of attempts.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from django.contrib import admin
from django.db import connections
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

from django_jobs.admin.masking import folded_traceback, masked_error, masked_json, masked_text
from django_jobs.models.attempt import Attempt
from django_jobs.models.job import Job
from django_jobs.progress import Shown, count
from django_jobs.rates import spell
from django_jobs.sanitize import mask_text
from django_jobs.states import State
from django_jobs.store import job_reads
from django_jobs.store.overview import progress_bar

#: Lines of a running attempt's log shown on the job page, and the most a request may ask for
#: (``?log_lines=``, a "show more" link adds :data:`LIVE_LINES` at a time).
LIVE_LINES = 200
MAX_LIVE_LINES = 5_000

#: The error column shows this many characters of the error's first line (all of it on hover).
ERROR_WIDTH = 90


def badge(state: str, label: str | None = None) -> SafeString:
    return format_html('<span class="dj-badge dj-{}">{}</span>', state, label or state)


def duration(value: timedelta | None) -> str:
    if value is None:
        return "-"
    seconds = value.total_seconds()
    if seconds < 60:
        return f"{seconds:.2f}s"
    minutes, seconds = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m {seconds:02d}s" if hours else f"{minutes}m {seconds:02d}s"


def timestamp(when: datetime) -> str:
    """A moment as the job page's timeline and its steps show it, to the millisecond."""
    return when.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def moment(when: datetime | None, empty: str = "-") -> SafeString | str:
    """A moment to the second in the current time zone, its full ISO timestamp (with its zone)
    on hover; ``empty`` when there is none."""
    if when is None:
        return empty
    local = timezone.localtime(when) if timezone.is_aware(when) else when
    return format_html(
        '<time datetime="{}" title="{}">{}</time>',
        local.isoformat(),
        local.isoformat(timespec="milliseconds"),
        local.strftime("%Y-%m-%d %H:%M:%S"),
    )


def first_line(text: str) -> str:
    """The first non-empty line of ``text``, found without splitting all of it."""
    start = 0
    while start < len(text):
        end = text.find("\n", start)
        end = len(text) if end == -1 else end
        line = text[start:end].strip()
        if line:
            return line
        start = end + 1
    return ""


def error_head(error: str) -> SafeString | str:
    """The error column: the first line of the job's last error, masked, shortened to
    :data:`ERROR_WIDTH` characters, the whole line on hover."""
    line = mask_text(first_line(error[:4096]))
    if not line:
        return ""
    short = line if len(line) <= ERROR_WIDTH else line[: ERROR_WIDTH - 1] + "…"
    return format_html('<span class="dj-error-head" title="{}">{}</span>', line, short)


def waited(job: Job) -> timedelta | None:
    """How long a started job waited in its queue: from when it could first run to its start."""
    if job.started_at is None or job.created_at is None:
        return None
    ready = max(job.created_at, job.run_after) if job.run_after else job.created_at
    return max(job.started_at - ready, timedelta(0))


def ran_for(job: Job) -> str:
    """How long a started job ran: to its end, or so far while it runs; ``…`` for a job that
    started and neither runs nor ended."""
    if job.finished_at is not None:
        return duration(job.duration)
    if job.state != State.RUNNING or job.started_at is None:
        return "…"
    return duration(max(timezone.now() - job.started_at, timedelta(0))) + " so far"


def state_badge(job: Job) -> SafeString:
    """A job's state badge; a pending job whose ``run_after`` is ahead (``is_scheduled``, by the
    database's clock: see ``JobList.get_queryset``) is ``scheduled``, with that time under it."""
    if getattr(job, "is_scheduled", False):
        return format_html(
            '{}<div class="dj-muted dj-run-after">at {}</div>',
            badge("scheduled"),
            moment(job.run_after),
        )
    label = job.state
    if job.state == State.RUNNING and job.cancel_requested:
        label = "running (cancelling)"
    return badge(job.state, label)


def progress_details(shown: Shown) -> SafeString:
    """The job page's progress: the bar, the counts, the message, when it was last updated,
    and the rate and time left when the total is known."""
    parts = [f"{count(shown.done)} of {count(shown.total)}" if shown.total else ""]
    if shown.updated_at is not None:
        ago = (timezone.now() - shown.updated_at).total_seconds()
        parts.append(f"updated {duration(timedelta(seconds=max(0.0, ago)))} ago")
    if shown.rate is not None:
        parts.append(f"{shown.rate:,.2f}/s")
    if shown.eta_seconds is not None:
        parts.append(f"about {duration(timedelta(seconds=shown.eta_seconds))} left")
    return format_html(
        '<div class="dj-progress-details">{}<div class="dj-muted">{}</div><div>{}</div></div>',
        progress_bar(shown),
        " · ".join(part for part in parts if part),
        mask_text(shown.message),
    )


def attempt_log(attempt: Attempt) -> SafeString | str:
    """An attempt's captured log, folded; a running attempt's, a link to the live log under the
    attempts (:func:`live_log`). Shown as it is stored, escaped but not masked again: every
    writer masks it before storing it (see log_tail.py), and it is the one text here that can
    be long."""
    if not attempt.log:
        return ""
    lines = attempt.log.splitlines()
    if attempt.outcome == "running":
        return format_html('<a href="#dj-live-log">live log, {} lines, below</a>', len(lines))
    return format_html(
        '<details class="dj-log"><summary>log ({} lines)</summary><pre>{}</pre></details>',
        len(lines),
        attempt.log,
    )


def live_log(attempt: Attempt, lines_wanted: int) -> dict[str, Any]:
    """The job page's live log of its running ``attempt``: its last ``lines_wanted`` lines (at
    most :data:`MAX_LIVE_LINES`), how many it has, and how many more a click would show. Shown
    as stored, as :func:`attempt_log` says."""
    lines = (attempt.log or "").splitlines()
    shown = max(1, min(lines_wanted, MAX_LIVE_LINES))
    more = min(len(lines), MAX_LIVE_LINES) - min(shown, len(lines))
    return {
        "text": "\n".join(lines[-shown:]),
        "shown": min(shown, len(lines)),
        "total": len(lines),
        "more": min(more, LIVE_LINES),
        "next": shown + LIVE_LINES,
        "number": attempt.number,
        "worker_id": attempt.worker_id,
    }


@admin.display(description="duration")
def _took(self: Any, run: Job | Attempt) -> str:
    """The duration column of the jobs and of a job's attempts."""
    return duration(run.duration)


class AttemptInline(admin.TabularInline):
    model = Attempt
    extra = 0
    can_delete = False
    ordering = ["number", "id"]
    fields = readonly_fields = (
        "number",
        "worker_id",
        "started",
        "finished",
        "took",
        "result",
        "details",
        "output",
    )
    verbose_name_plural = "attempts"

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    took = _took

    @admin.display(description="started at")
    def started(self, attempt: Attempt) -> SafeString | str:
        return moment(attempt.started_at)

    @admin.display(description="finished at")
    def finished(self, attempt: Attempt) -> SafeString | str:
        return moment(attempt.finished_at)

    @admin.display(description="outcome")
    def result(self, attempt: Attempt) -> SafeString:
        return badge(attempt.outcome)

    @admin.display(description="error")
    def details(self, attempt: Attempt) -> SafeString | str:
        return masked_error(attempt.error, attempt.traceback)

    @admin.display(description="log")
    def output(self, attempt: Attempt) -> SafeString | str:
        return attempt_log(attempt)


def _payload_field(field: str) -> Callable[[Any, Job], SafeString]:
    """A job page field showing the job's JSON column ``field``, masked."""

    @admin.display(description=field)
    def show(self: Any, job: Job) -> SafeString:
        return masked_json(getattr(job, field))

    return show


class JobColumns(admin.ModelAdmin):
    """The part of :class:`~django_jobs.admin.JobAdmin` that renders the list's columns and the
    job page's read-only fields."""

    @admin.display(description="state", ordering="state")
    def state_badge(self, job: Job) -> SafeString:
        return state_badge(job)

    @admin.display(description="state", ordering="state")
    def state_cell(self, job: Job) -> SafeString:
        """The list's state column: the badge, then the attempts and, while it runs, the
        progress bar."""
        progress = self.progress_column(job)
        return format_html(
            '{}<div class="dj-muted dj-attempts">attempt {} of {}</div>{}',
            state_badge(job),
            job.attempt,
            job.max_attempts,
            format_html('<div class="dj-cell-progress">{}</div>', progress) if progress else "",
        )

    @admin.display(description="task", ordering="task")
    def task_cell(self, job: Job) -> SafeString:
        """The task's name, its queue and its priority under it."""
        priority = f" · priority {job.priority}" if job.priority else ""
        return format_html(
            '<span class="dj-task">{}</span><div class="dj-muted">{}{}</div>',
            job.task,
            job.queue,
            priority,
        )

    @admin.display(description="error")
    def error_column(self, job: Job) -> SafeString | str:
        return error_head(job.error)

    @admin.display(description="when", ordering="id")
    def when(self, job: Job) -> SafeString:
        """Created, started and finished, stacked, each to the second, and how long the job
        waited in its queue and ran."""
        rows: list[tuple[str, SafeString | str]] = [
            (label, moment(at))
            for label, at in (
                ("created", job.created_at),
                ("started", job.started_at),
                ("finished", job.finished_at),
            )
            if at is not None
        ]
        if job.started_at is not None:
            rows.append(("waited", duration(waited(job))))
            rows.append(("ran", ran_for(job)))
        return format_html(
            '<dl class="dj-when">{}</dl>',
            format_html_join("", "<dt>{}</dt><dd>{}</dd>", rows),
        )

    @admin.display(description="cancel requested")
    def cancel_requested_text(self, job: Job) -> SafeString:
        """Plain words, "no" muted: Django's boolean icon would show a red cross for a job
        nobody asked to stop, as if something were wrong."""
        if job.cancel_requested:
            return format_html('<strong class="dj-flag">{}</strong>', "yes")
        return format_html('<span class="dj-muted">{}</span>', "no")

    @admin.display(description="cancel request")
    def cancel_note(self, job: Job) -> SafeString:
        """On the page of a job that was asked to stop and returned normally all the same."""
        return format_html(
            '<div class="dj-note"><strong>{}</strong>: {}</div>',
            "Finished despite the cancel request",
            "the job was asked to stop while it ran, and returned normally, so it ended done "
            "with its result.",
        )

    @admin.display(description="attempts")
    def attempts(self, job: Job) -> str:
        return f"{job.attempt}/{job.max_attempts}"

    @admin.display(description="progress")
    def progress_column(self, job: Job) -> SafeString | str:
        shown = job.progress
        return progress_bar(shown) if shown is not None and job.state == State.RUNNING else ""

    @admin.display(description="progress")
    def progress_text(self, job: Job) -> SafeString | str:
        shown = job.progress
        if shown is None:
            return "-"
        return format_html("{} (attempt {})", progress_details(shown), job.attempt)

    took = _took

    @admin.display(description="created at")
    def created_text(self, job: Job) -> SafeString | str:
        return moment(job.created_at)

    @admin.display(description="run after")
    def run_after_text(self, job: Job) -> SafeString | str:
        return moment(job.run_after)

    @admin.display(description="started at")
    def started_text(self, job: Job) -> SafeString | str:
        return moment(job.started_at)

    @admin.display(description="finished at")
    def finished_text(self, job: Job) -> SafeString | str:
        return moment(job.finished_at)

    @admin.display(description="Controls")
    def controls_text(self, job: Job) -> str:
        """The job's limits and deadline, and, while a full rate window holds it, when it may
        start."""
        parts = []
        if job.concurrency_key and not job.concurrency_key.startswith("rate:"):
            parts.append(f"at most {job.concurrency_limit} running of {job.concurrency_key}")
        if job.rate_key and job.rate_limit and job.rate_period:
            parts.append(f"rate {spell(job.rate_limit, job.rate_period)} of {job.rate_key}")
        if job.expires_at:
            parts.append(f"expires {timestamp(job.expires_at)}")
        if job.state == "pending":
            with connections[job._state.db or "default"].cursor() as cursor:
                held = job_reads.rate_next_start(cursor, job.rate_key, job.queue)
            if held is not None:
                parts.append(f"held by a rate limit until {timestamp(held)}")
        return "; ".join(parts) or "none"

    @admin.display(description="error")
    def error_text(self, job: Job) -> str:
        return masked_text(job.error)

    args_pretty = _payload_field("args")
    kwargs_pretty = _payload_field("kwargs")
    result_pretty = _payload_field("result")

    @admin.display(description="related jobs")
    def graph(self, job: Job) -> SafeString:
        sections: list[tuple[str, QuerySet[Job], int | None]] = []
        if job.parent_id:
            sections.append(("Parent", Job.objects.filter(pk=job.parent_id), 1))
        sections.append(("Children", job.children.order_by("id"), job.children.count()))
        sections.append(("Depends on", job.dependencies, None))
        sections.append(("Needed by", job.dependents, None))
        rows = []
        for title, queryset, total in sections:
            related = list(queryset.only("id", "task", "state")[:50])
            if not related:
                continue
            links = format_html_join(
                " ",
                '<a href="{}">#{} {}</a> {}',
                (
                    (
                        reverse("admin:django_jobs_job_change", args=[r.pk]),
                        r.pk,
                        r.task,
                        badge(r.state),
                    )
                    for r in related
                ),
            )
            more = ""
            if total is not None and total > len(related):
                url = reverse("admin:django_jobs_job_changelist") + f"?parent={job.pk}"
                more = format_html(' <a href="{}">… {} in all</a>', url, total)
            rows.append(format_html("<div><strong>{}:</strong> {}{}</div>", title, links, more))
        if not rows:
            return format_html("<span>{}</span>", "none")
        return format_html_join("", "{}", ((row,) for row in rows))

    @admin.display(description="timeline")
    def timeline(self, job: Job) -> SafeString:
        events: list[tuple[datetime, str, str]] = [(job.created_at, "enqueued", "pending")]
        for attempt in job.attempts.order_by("number", "id"):
            events.append(
                (
                    attempt.started_at,
                    f"attempt {attempt.number} started on {attempt.worker_id}",
                    "running",
                )
            )
            if attempt.finished_at:
                events.append(
                    (
                        attempt.finished_at,
                        f"attempt {attempt.number} ended {attempt.outcome}",
                        attempt.outcome,
                    )
                )
        if job.finished_at:
            events.append((job.finished_at, f"job {job.state}", job.state))
        events.sort(key=lambda e: e[0])
        return format_html(
            '<ol class="dj-timeline">{}</ol>',
            format_html_join(
                "",
                "<li><time>{}</time> {}</li>",
                ((timestamp(when), badge(state, text)) for when, text, state in events),
            ),
        )


def _link(job_pk: int, text: str) -> SafeString:
    return format_html(
        '<a href="{}">{}</a>', reverse("admin:django_jobs_job_change", args=[job_pk]), text
    )


def job_summary(job: Job) -> SafeString:
    """The header of a job's page: its state, task, queue, attempts, how long it waited and ran,
    its worker and its relatives, and its last error, linked to that error's traceback, which
    follows, open when the job failed."""
    facts: list[tuple[str, SafeString | str]] = [
        ("state", state_badge(job)),
        ("task", format_html('<span class="dj-task">{}</span>', job.task)),
        ("queue", job.queue),
        ("attempts", f"{job.attempt} of {job.max_attempts}"),
        ("queued for", "not started yet" if job.started_at is None else duration(waited(job))),
        ("ran for", "-" if job.started_at is None else ran_for(job)),
        ("worker", job.worker_id or "-"),
    ]
    changelist = reverse("admin:django_jobs_job_changelist")
    relatives = []
    if job.parent_id:
        relatives.append(format_html("parent {}", _link(job.parent_id, f"#{job.parent_id}")))
    children = job.children.count()
    if children:
        relatives.append(
            format_html('<a href="{}?parent={}">{} child{}</a>', changelist, job.pk, children,
                        "" if children == 1 else "ren")
        )  # fmt: skip
    for title, related in (("depends on", job.dependencies), ("needed by", job.dependents)):
        ids = list(related.values_list("id", flat=True)[:10])
        if ids:
            links = format_html_join(", ", "{}", ((_link(pk, f"#{pk}"),) for pk in ids))
            relatives.append(format_html("{} {}", title, links))
    if relatives:
        facts.append(("related", format_html_join(" · ", "{}", ((r,) for r in relatives))))
    rows = format_html_join("", '<div class="dj-fact"><dt>{}</dt><dd>{}</dd></div>', facts)
    error = ""
    traceback = (
        job.attempts.exclude(traceback="")
        .order_by("-number", "-id")
        .values_list("traceback", flat=True)
        .first()
        if job.error
        else None
    )
    if job.error:
        link = mark_safe(' <a href="#dj-traceback">traceback ↓</a>') if traceback else ""
        error = format_html(
            '<div class="dj-summary-error"><strong>error</strong> {}{}</div>',
            error_head(job.error),
            link,
        )
    tb = ""
    if traceback:
        tb = format_html(
            '<details class="dj-traceback dj-last-traceback" id="dj-traceback"{}>'
            "<summary>traceback of the last error</summary>{}</details>",
            mark_safe(" open") if job.state == State.ERROR else "",
            folded_traceback(traceback),
        )
    return format_html(
        '<div class="module dj-summary" id="dj-summary"><dl class="dj-facts">{}</dl>{}{}</div>',
        rows,
        error,
        tb,
    )
