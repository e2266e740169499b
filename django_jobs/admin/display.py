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
from django.utils.safestring import SafeString

from django_jobs.admin.masking import masked_error, masked_json, masked_text
from django_jobs.models.attempt import Attempt
from django_jobs.models.job import Job
from django_jobs.progress import Shown, count
from django_jobs.rates import spell
from django_jobs.sanitize import mask_text
from django_jobs.states import State
from django_jobs.store import job_reads
from django_jobs.store.overview import progress_bar

#: Lines of a running attempt's log shown open on the job page.
LIVE_LINES = 40


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
    """An attempt's captured log, folded; a running attempt's last lines, open. Shown as it is
    stored, escaped but not masked again: every writer masks it before storing it (see
    log_tail.py), and it is the one text here that can be long."""
    if not attempt.log:
        return ""
    lines = attempt.log.splitlines()
    if attempt.outcome == "running":
        return format_html(
            '<details class="dj-log" open><summary>last {} of {} lines (live)</summary>'
            "<pre>{}</pre></details>",
            min(LIVE_LINES, len(lines)),
            len(lines),
            "\n".join(lines[-LIVE_LINES:]),
        )
    return format_html(
        '<details class="dj-log"><summary>log ({} lines)</summary><pre>{}</pre></details>',
        len(lines),
        attempt.log,
    )


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
        "started_at",
        "finished_at",
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
        label = job.state
        if job.state == State.RUNNING and job.cancel_requested:
            label = "running (cancelling)"
        return badge(job.state, label)

    @admin.display(description="cancel requested")
    def cancel_requested_text(self, job: Job) -> str:
        """Plain words: Django's boolean icon would show a red cross for a job nobody asked to
        stop, as if something were wrong."""
        return "yes" if job.cancel_requested else "no"

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

    @admin.display(description="error")
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
