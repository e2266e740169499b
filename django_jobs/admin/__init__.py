"""The operator's admin: a fast job list at any size, retry/cancel/run-now with permissions, and a
read-only job page with its attempts, graph and timeline.

Speed at millions of rows: the list never runs a full ``COUNT(*)`` (see
:class:`EstimatedCountPaginator`), shows no facets, offers filters with fixed choices (never
``SELECT DISTINCT`` over the table), and orders by the primary key, newest first.

This module assembles :class:`JobAdmin` from its parts and registers it and the dashboard:

- :mod:`~django_jobs.admin.listing`: the list's rows: paginator, search, allowed lookups;
- :mod:`~django_jobs.admin.filters`: the list's filters;
- :mod:`~django_jobs.admin.display`: the columns and fields, and the attempts' table;
- :mod:`~django_jobs.admin.checkpoint`: the job page's steps and cursors;
- :mod:`~django_jobs.admin.masking`: the masked payloads, errors and tracebacks;
- :mod:`~django_jobs.admin.actions`: retry (resuming, or from the start), cancel, run now and
  delete, with their permissions;
- :mod:`~django_jobs.admin.dashboard`: the dashboard page;
- :mod:`~django_jobs.schedules.admin` (and its form, :mod:`~django_jobs.schedules.forms`):
  the periodic jobs, registered there.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.admin.utils import flatten_fieldsets
from django.http import HttpRequest, HttpResponse

from django_jobs.admin.actions import JobActions
from django_jobs.admin.dashboard import DashboardAdmin, link_from_index
from django_jobs.admin.display import AttemptInline, JobColumns, badge
from django_jobs.admin.filters import (
    CreatedFilter,
    FinishedFilter,
    FixedChoicesFilter,
    ParentFilter,
    QueueFilter,
    RecentFilter,
    StateFilter,
    TaskFilter,
    state_tabs,
)
from django_jobs.admin.listing import (
    ARGUMENT_SEARCH_DEPTH,
    MAX_JOB_ID,
    EstimatedCountPaginator,
    JobList,
    job_id,
    storable,
)
from django_jobs.models.job import Dashboard, Job
from django_jobs.queues.admin import QueueAdmin
from django_jobs.schedules.admin import ScheduleAdmin
from django_jobs.states import State
from django_jobs.tokens.admin import ApiTokenAdmin

__all__ = [
    "MAX_JOB_ID",
    "ApiTokenAdmin",
    "AttemptInline",
    "CreatedFilter",
    "DashboardAdmin",
    "EstimatedCountPaginator",
    "FinishedFilter",
    "FixedChoicesFilter",
    "JobAdmin",
    "ParentFilter",
    "QueueAdmin",
    "QueueFilter",
    "RecentFilter",
    "ScheduleAdmin",
    "StateFilter",
    "TaskFilter",
    "badge",
    "job_id",
    "storable",
]


@admin.register(Job)
class JobAdmin(JobActions, JobColumns, JobList, admin.ModelAdmin):
    # Fits 1280 px: the queue and priority sit under the task; the attempts, the progress bar
    # and a scheduled job's time under its state; the three times and the durations are one
    # column; long task names, worker ids and errors wrap; and below 1600 px the filters go
    # under the list (admin.css).
    list_display = ["id", "task_cell", "state_cell", "worker_id", "error_column", "when"]
    list_display_links = ["id", "task_cell"]
    list_filter = [
        StateFilter,
        QueueFilter,
        TaskFilter,
        CreatedFilter,
        FinishedFilter,
        ParentFilter,
    ]
    search_fields = ["task"]  # see get_search_results
    search_help_text = (
        "Exact job id, task name prefix, worker id prefix, exact unique key, or an argument "
        f'value as key=value (report_id=7, name="x"), looked for among the newest '
        f"{ARGUMENT_SEARCH_DEPTH:,} jobs only; masked arguments cannot be searched."
    )
    ordering = ["-id"]
    paginator = EstimatedCountPaginator
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    list_per_page = 100
    actions = [
        "retry_selected",
        "retry_from_start_selected",
        "cancel_selected",
        "run_selected_now",
        "delete_selected",
    ]
    inlines = [AttemptInline]
    fieldsets = [
        (
            None,
            {
                "fields": [
                    ("id", "task", "state_badge"),
                    ("queue", "priority", "attempts"),
                    ("worker_id", "unique_key", "cancel_requested_text"),
                    "controls_text",
                    "progress_text",
                    "error_text",
                ]
            },
        ),
        (
            "Timing",
            {
                "fields": [
                    ("created_text", "run_after_text"),
                    ("started_text", "finished_text", "took"),
                    "timeline",
                ]
            },
        ),
        ("Payload", {"fields": ["args_pretty", "kwargs_pretty", "result_pretty"]}),
        ("Graph", {"fields": ["graph"]}),
    ]
    #: Every field of the job page: none is editable.
    readonly_fields = [*flatten_fieldsets(fieldsets), "cancel_note"]

    class Media:
        css = {"all": ["django_jobs/admin.css"]}
        js = ["django_jobs/jobs.js"]

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        """The list, with its state tabs (``state_tabs``) above it."""
        response = super().changelist_view(request, extra_context)
        context = getattr(response, "context_data", None)
        if context is not None and "cl" in context:  # not a redirect, nor an action's own page
            context["state_tabs"] = state_tabs(request, context["cl"])
        return response

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        """The page of a job that ended done although it was asked to stop says so, under its
        state."""
        fieldsets = super().get_fieldsets(request, obj)
        if obj is None or obj.state != State.DONE or not obj.cancel_requested:
            return fieldsets
        (name, options), *rest = fieldsets
        first, *others = options["fields"]
        return [(name, {**options, "fields": [first, "cancel_note", *others]}), *rest]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # jobs are enqueued by code, never typed in

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # every field is read-only; state changes go through the actions


admin.site.register(Dashboard, DashboardAdmin)
link_from_index(admin.site)
