"""The operator's admin: a fast job list at any size, retry/cancel/run-now with permissions, and a
read-only job page with its attempts, graph and timeline.

Speed at millions of rows: the list never runs a full ``COUNT(*)`` (see
:class:`EstimatedCountPaginator`), shows no facets, offers filters with fixed choices (never
``SELECT DISTINCT`` over the table), and orders by the primary key, newest first.
"""

from __future__ import annotations

import json
import re
from datetime import timedelta
from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db import transaction
from django.db.models import Q, QuerySet
from django.db.models.constants import LOOKUP_SEP
from django.db.models.functions import Now
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.functional import cached_property
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from django_jobs import actions, conf, dashboard
from django_jobs.models import Attempt, Dashboard, Job
from django_jobs.registry import registry
from django_jobs.sanitize import mask_text, mask_value
from django_jobs.states import CANCEL, RETRY, RUN_NOW, TERMINAL_STATES, State


class EstimatedCountPaginator(Paginator):
    """Counts exactly up to ``EXACT_LIMIT`` rows (a cheap ``LIMIT`` count), and beyond that
    uses the planner's estimate, so no page of a huge list runs a full ``COUNT(*)``."""

    EXACT_LIMIT = 10_000

    @cached_property
    def count(self) -> int:
        queryset = self.object_list
        exact = queryset.order_by()[: self.EXACT_LIMIT + 1].count()
        if exact <= self.EXACT_LIMIT:
            return exact
        plan = json.loads(queryset.order_by().explain(format="json"))
        return max(int(plan[0]["Plan"]["Plan Rows"]), exact)


#: The largest id a job can have (``id`` is a bigint).
MAX_JOB_ID = 2**63 - 1


def job_id(text: str) -> int | None:
    """``text`` read as a job id (``"42"`` or ``"#42"``), or None. Only ASCII digits count:
    ``str.isdigit`` also accepts ``"²"``, which ``int()`` refuses, and ``int()`` accepts ``"٣"``."""
    digits = text.removeprefix("#")
    if not re.fullmatch(r"[0-9]{1,19}", digits) or int(digits) > MAX_JOB_ID:
        return None
    return int(digits)


def storable(text: str) -> bool:
    """Whether a PostgreSQL text column could hold ``text``: none holds a NUL character or a lone
    surrogate, so a term with one matches nothing (and the driver would refuse to send it)."""
    return "\x00" not in text and not re.search("[\ud800-\udfff]", text)


def badge(state: str, label: str | None = None) -> SafeString:
    return format_html('<span class="dj-badge dj-{}">{}</span>', state, label or state)


class FixedChoicesFilter(admin.SimpleListFilter):
    """Filter on one column with choices known in advance: never ``SELECT DISTINCT``."""

    field = ""

    def options(self) -> list[tuple[str, str]]:
        raise NotImplementedError

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return self.options()

    def queryset(self, request: HttpRequest, queryset: QuerySet[Job]) -> QuerySet[Job]:
        return queryset.filter(**{self.field: self.value()}) if self.value() else queryset


class StateFilter(FixedChoicesFilter):
    title = parameter_name = field = "state"

    def options(self) -> list[tuple[str, str]]:
        return list(State.choices)


class QueueFilter(FixedChoicesFilter):
    title = parameter_name = field = "queue"

    def options(self) -> list[tuple[str, str]]:
        return [(q, q) for q in conf.queues()]


class TaskFilter(FixedChoicesFilter):
    title = parameter_name = field = "task"

    def options(self) -> list[tuple[str, str]]:
        return [(name, name) for name in registry.names()]


class RecentFilter(admin.SimpleListFilter):
    """Time ranges counted back from the database's clock."""

    field = "created_at"
    RANGES = {"1h": timedelta(hours=1), "24h": timedelta(days=1), "7d": timedelta(days=7)}
    LABELS = {"1h": "Last hour", "24h": "Last 24 hours", "7d": "Last 7 days"}

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return list(self.LABELS.items())

    def queryset(self, request: HttpRequest, queryset: QuerySet[Job]) -> QuerySet[Job]:
        if self.value() not in self.RANGES:
            return queryset
        return queryset.filter(**{f"{self.field}__gte": Now() - self.RANGES[self.value()]})


class CreatedFilter(RecentFilter):
    title = "created"
    parameter_name = "created"
    field = "created_at"


class FinishedFilter(RecentFilter):
    title = "finished"
    parameter_name = "finished"
    field = "finished_at"


class ParentFilter(admin.SimpleListFilter):
    """``?parent=<id>``: the children of a job (linked from its page; no choices shown)."""

    title = "parent"
    parameter_name = "parent"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return []

    def has_output(self) -> bool:
        # Django drops a filter without choices, unapplied: this one applies when it is in the
        # query string, and is shown then, to be cleared.
        return self.value() is not None

    def queryset(self, request: HttpRequest, queryset: QuerySet[Job]) -> QuerySet[Job]:
        parent = job_id(self.value() or "")
        return queryset if parent is None else queryset.filter(parent_id=parent)


class AttemptInline(admin.TabularInline):
    model = Attempt
    extra = 0
    can_delete = False
    ordering = ["number", "id"]
    fields = ["number", "worker_id", "started_at", "finished_at", "took", "result", "details"]
    readonly_fields = fields
    verbose_name_plural = "attempts"

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description="duration")
    def took(self, attempt: Attempt) -> str:
        return _duration(attempt.duration)

    @admin.display(description="outcome")
    def result(self, attempt: Attempt) -> SafeString:
        return badge(attempt.outcome)

    @admin.display(description="error")
    def details(self, attempt: Attempt) -> SafeString | str:
        if not attempt.error and not attempt.traceback:
            return ""
        if not attempt.traceback:
            return mask_text(attempt.error)
        return format_html(
            '{}<details class="dj-traceback"><summary>traceback</summary><pre>{}</pre></details>',
            mask_text(attempt.error),
            mask_text(attempt.traceback),
        )


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    list_display = [
        "id",
        "task",
        "state_badge",
        "queue",
        "priority",
        "attempts",
        "worker_id",
        "created_at",
        "started_at",
        "finished_at",
        "took",
    ]
    list_display_links = ["id", "task"]
    list_filter = [
        StateFilter,
        QueueFilter,
        TaskFilter,
        CreatedFilter,
        FinishedFilter,
        ParentFilter,
    ]
    search_fields = ["task"]  # see get_search_results
    search_help_text = "Exact job id, task name prefix, worker id prefix, or exact unique key."
    ordering = ["-id"]
    paginator = EstimatedCountPaginator
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    list_per_page = 100
    actions = ["retry_selected", "cancel_selected", "run_selected_now", "delete_selected"]
    inlines = [AttemptInline]
    readonly_fields = [
        "id",
        "task",
        "state_badge",
        "queue",
        "priority",
        "attempts",
        "worker_id",
        "unique_key",
        "created_at",
        "run_after",
        "started_at",
        "finished_at",
        "took",
        "cancel_requested",
        "error_text",
        "args_pretty",
        "kwargs_pretty",
        "result_pretty",
        "graph",
        "timeline",
    ]
    fieldsets = [
        (
            None,
            {
                "fields": [
                    ("id", "task", "state_badge"),
                    ("queue", "priority", "attempts"),
                    ("worker_id", "unique_key", "cancel_requested"),
                    "error_text",
                ]
            },
        ),
        (
            "Timing",
            {
                "fields": [
                    ("created_at", "run_after"),
                    ("started_at", "finished_at", "took"),
                    "timeline",
                ]
            },
        ),
        ("Payload", {"fields": ["args_pretty", "kwargs_pretty", "result_pretty"]}),
        ("Graph", {"fields": ["graph"]}),
    ]
    LIST_FIELDS = [
        "id",
        "task",
        "state",
        "queue",
        "priority",
        "attempt",
        "max_attempts",
        "worker_id",
        "created_at",
        "started_at",
        "finished_at",
    ]

    class Media:
        css = {"all": ["django_jobs/admin.css"]}

    # -------------------------------------------------------------- rows and permissions

    def get_queryset(self, request: HttpRequest) -> QuerySet[Job]:
        queryset = super().get_queryset(request)
        match = request.resolver_match
        if match is not None and match.url_name and match.url_name.endswith("changelist"):
            # The list never shows the JSON payloads: don't fetch them.
            queryset = queryset.only(*self.LIST_FIELDS)
        return queryset

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Job], search_term: str
    ) -> tuple[QuerySet[Job], bool]:
        term = search_term.strip()
        if not term:
            return queryset, False
        if not storable(term):
            return queryset.none(), False
        condition = Q(task__startswith=term) | Q(worker_id__startswith=term) | Q(unique_key=term)
        if (pk := job_id(term)) is not None:
            condition |= Q(pk=pk)
        return queryset.filter(condition), False

    #: Fields the job page shows masked, or not at all.
    MASKED_FIELDS = {"args", "kwargs", "result", "error", "lease"}

    def lookup_allowed(self, lookup: str, value: str, request: HttpRequest | None = None) -> bool:
        """Every parameter of the list's query string, the filters' own included, comes here;
        what it refuses is answered with a 400."""
        # Django lets the list be filtered on any column, but a filter on a masked value would
        # reveal it a letter at a time (?kwargs__password__startswith=h). (Lookups through a
        # relation it refuses itself.) A value PostgreSQL cannot hold would fail in the driver.
        if lookup.split(LOOKUP_SEP)[0] in self.MASKED_FIELDS or not storable(value):
            return False
        return super().lookup_allowed(lookup, value, request)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # jobs are enqueued by code, never typed in

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # every field is read-only; state changes go through the actions

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        if obj is not None and obj.state not in TERMINAL_STATES:
            return False
        return super().has_delete_permission(request, obj)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        # A small batch per statement, SKIP LOCKED, never one transaction over the selection.
        report = actions.delete(queryset.filter(state__in=TERMINAL_STATES))
        if report.skipped:
            self.message_user(request, report.message("deleted"), messages.WARNING)

    def get_deleted_objects(self, objs: Any, request: HttpRequest) -> tuple[Any, ...]:
        """The confirmation page's summary, counted in SQL: Django's own would load every
        selected job and its attempts into memory to list them."""
        ids = objs.values("pk") if isinstance(objs, QuerySet) else [obj.pk for obj in objs]
        jobs = Job.objects.filter(pk__in=ids, state__in=TERMINAL_STATES)
        counts = {
            "jobs (finished; unfinished ones are kept)": jobs.count(),
            "attempts": Attempt.objects.filter(job__in=jobs).count(),
        }
        perms_needed = set() if self.has_delete_permission(request) else {"job"}
        summary = [f"{n} {what}" for what, n in counts.items()]
        return summary, counts, perms_needed, []

    def has_retry_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("django_jobs.retry_job")

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("django_jobs.cancel_job")

    def has_run_now_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("django_jobs.run_job_now")

    # -------------------------------------------------------------- actions

    PERMISSIONS = {
        "retry_selected": "retry",
        "cancel_selected": "cancel",
        "run_selected_now": "run_now",
    }

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        # Django leaves an action the user may not run out of the menu, and ignores it when
        # posted; posting one anyway is refused outright instead.
        if request.method == "POST":
            permission = self.PERMISSIONS.get(request.POST.get("action", ""))
            if permission and not getattr(self, f"has_{permission}_permission")(request):
                raise PermissionDenied
        return super().changelist_view(request, extra_context)

    @admin.action(description="Retry selected jobs", permissions=["retry"])
    def retry_selected(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        self._report(request, actions.retry(queryset), "requeued")

    @admin.action(description="Cancel selected jobs", permissions=["cancel"])
    def cancel_selected(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        self._report(request, actions.cancel(queryset), "cancelled or asked to stop")

    @admin.action(description="Run selected pending jobs now", permissions=["run_now"])
    def run_selected_now(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        self._report(request, actions.run_now(queryset), "made ready now")

    def _report(self, request: HttpRequest, report: actions.ActionReport, done: str) -> None:
        level = messages.SUCCESS if report.changed else messages.WARNING
        self.message_user(request, report.message(done), level)

    def get_urls(self) -> list[URLPattern]:
        # Every page runs outside ATOMIC_REQUESTS' transaction: an action's statements are each
        # their own short transaction with bounded waits, never one long one over the selection.
        non_atomic = transaction.non_atomic_requests(using=conf.database_alias())
        urls = self._urls()
        for pattern in urls:
            non_atomic(pattern.callback)
        return urls

    def _urls(self) -> list[URLPattern]:
        wrap = self.admin_site.admin_view
        return [
            path(
                "<int:pk>/retry/",
                wrap(self.job_action_view),
                {"action": "retry_selected"},
                name="django_jobs_job_retry",
            ),
            path(
                "<int:pk>/cancel/",
                wrap(self.job_action_view),
                {"action": "cancel_selected"},
                name="django_jobs_job_cancel",
            ),
            path(
                "<int:pk>/run-now/",
                wrap(self.job_action_view),
                {"action": "run_selected_now"},
                name="django_jobs_job_run_now",
            ),
            *super().get_urls(),
        ]

    def job_action_view(self, request: HttpRequest, pk: int, action: str) -> HttpResponse:
        """The buttons on a job's page: POST only, same permissions as the list actions."""
        if request.method != "POST":
            return HttpResponse(status=405, headers={"Allow": "POST"})
        if not getattr(self, f"has_{self.PERMISSIONS[action]}_permission")(request):
            raise PermissionDenied
        job = get_object_or_404(Job, pk=pk)
        getattr(self, action)(request, Job.objects.filter(pk=job.pk))
        return HttpResponseRedirect(reverse("admin:django_jobs_job_change", args=[job.pk]))

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        job = self.get_object(request, object_id)
        buttons = []
        if job is not None:
            if job.state in RETRY.sources and self.has_retry_permission(request):
                buttons.append(("Retry", "admin:django_jobs_job_retry"))
            if job.state in CANCEL.sources and self.has_cancel_permission(request):
                buttons.append(("Cancel", "admin:django_jobs_job_cancel"))
            if job.state in RUN_NOW.sources and self.has_run_now_permission(request):
                buttons.append(("Run now", "admin:django_jobs_job_run_now"))
        context = {
            **(extra_context or {}),
            "job_buttons": [(label, reverse(name, args=[object_id])) for label, name in buttons],
        }
        return super().change_view(request, object_id, form_url, context)

    # -------------------------------------------------------------- columns and fields

    @admin.display(description="state", ordering="state")
    def state_badge(self, job: Job) -> SafeString:
        label = job.state
        if job.state == State.RUNNING and job.cancel_requested:
            label = "running (cancelling)"
        return badge(job.state, label)

    @admin.display(description="attempts")
    def attempts(self, job: Job) -> str:
        return f"{job.attempt}/{job.max_attempts}"

    @admin.display(description="duration")
    def took(self, job: Job) -> str:
        return _duration(job.duration)

    @admin.display(description="error")
    def error_text(self, job: Job) -> str:
        return mask_text(job.error) if job.error else "-"

    @admin.display(description="args")
    def args_pretty(self, job: Job) -> SafeString:
        return _pretty(job.args)

    @admin.display(description="kwargs")
    def kwargs_pretty(self, job: Job) -> SafeString:
        return _pretty(job.kwargs)

    @admin.display(description="result")
    def result_pretty(self, job: Job) -> SafeString:
        return _pretty(job.result)

    @admin.display(description="related jobs")
    def graph(self, job: Job) -> SafeString:
        sections = []
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
        events: list[tuple[Any, str, str]] = [(job.created_at, "enqueued", "pending")]
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
                (
                    (when.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3], badge(state, text))
                    for when, text, state in events
                ),
            ),
        )


def _duration(value: timedelta | None) -> str:
    if value is None:
        return "-"
    seconds = value.total_seconds()
    if seconds < 60:
        return f"{seconds:.2f}s"
    minutes, seconds = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m {seconds:02d}s" if hours else f"{minutes}m {seconds:02d}s"


def _pretty(value: Any) -> SafeString:
    if value is None:
        return format_html("<span>{}</span>", "-")
    text = json.dumps(mask_value(value), indent=2, sort_keys=True, ensure_ascii=False)
    return format_html('<pre class="dj-json">{}</pre>', text)


@admin.register(Dashboard)
class DashboardAdmin(admin.ModelAdmin):
    """The dashboard page, listed in the admin index beside the jobs: queues, throughput,
    workers, running, stuck and failing jobs, from the same SQL views as the Grafana dashboard.
    Anyone who may view jobs may view it."""

    def has_module_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("django_jobs.view_job")

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm("django_jobs.view_job")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_urls(self) -> list[URLPattern]:
        # The dashboard is one page. Django's pages per object would show a job's payload as
        # the proxy model's fields, unmasked: they do not exist here (the job page shows it).
        name = f"{self.opts.app_label}_{self.opts.model_name}_changelist"
        return [path("", self.admin_site.admin_view(self.changelist_view), name=name)]

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        context = {
            **self.admin_site.each_context(request),
            **dashboard.context(),
            "title": "Jobs dashboard",
            "opts": self.model._meta,
            **(extra_context or {}),
        }
        return TemplateResponse(request, "admin/django_jobs/dashboard.html", context)
