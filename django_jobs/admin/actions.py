"""What an operator may do to jobs from the admin, and who may: retry (resuming from the job's
recorded steps and cursors, or from the start, forgetting them), cancel and run now (from the
list's action menu or the buttons on a job's page), and delete finished jobs. Each is done by
:mod:`django_jobs.operator_actions` in short transactions, and each checks its own permission
(``retry_job`` for both retries, ``cancel_job``, ``run_job_now``; Django's ``delete_job`` for
deleting).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.actions import delete_selected as django_delete_selected
from django.core.exceptions import PermissionDenied
from django.db import models, transaction
from django.db.models import Model, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.urls import URLPattern, path, reverse

from django_jobs import conf, operator_actions
from django_jobs.admin.checkpoint import JobCheckpoint, job_checkpoint
from django_jobs.admin.display import LIVE_LINES, job_summary, live_log
from django_jobs.admin.listing import job_id, storable
from django_jobs.models.attempt import Attempt
from django_jobs.models.job import Job
from django_jobs.states import CANCEL, RETRY, RUN_NOW, TERMINAL_STATES


class Button(NamedTuple):
    """A button of an object's page: it posts to ``url``."""

    label: str
    url: str
    #: Shown when the pointer rests on it: what it does, where the label is too short to say.
    title: str = ""
    #: Asked before it posts (the browser's confirm dialog), for a button that forgets work.
    confirm: str = ""


class CheckedSelection(admin.ModelAdmin):
    """A list whose action refuses, with a 400, a selection that names no row: an id that is
    not a whole number, or a key PostgreSQL cannot hold. Django would fail on it with a 500."""

    def response_action(  # Django 6 adds action_location, passed on in args
        self, request: HttpRequest, queryset: QuerySet[Any], *args: Any, **kwargs: Any
    ) -> Any:
        for value in request.POST.getlist(helpers.ACTION_CHECKBOX_NAME):
            if not self.selectable(value):
                return HttpResponseBadRequest(
                    f"{helpers.ACTION_CHECKBOX_NAME}: {value[:50]!r} is not the key of a row"
                )
        return super().response_action(request, queryset, *args, **kwargs)

    def selectable(self, value: str) -> bool:
        pk = self.model._meta.pk
        if isinstance(pk, models.IntegerField):  # BigAutoField and AutoField included
            return not value.startswith("#") and job_id(value) is not None
        return storable(value) and len(value) <= (getattr(pk, "max_length", None) or 255)


class PageButtons(CheckedSelection):
    """A model admin whose change page shows buttons (``job_buttons`` in its template): those
    that its ``page_buttons(request, obj)`` returns. ``page_context(request, obj)`` is what the
    page's template gets besides its fields: the buttons, and whatever else a subclass adds."""

    def page_buttons(self, request: HttpRequest, obj: Any) -> list[Button]:
        raise NotImplementedError

    def page_context(self, request: HttpRequest, obj: Any) -> dict[str, Any]:
        return {"job_buttons": self.page_buttons(request, obj)}

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        obj = self.get_object(request, object_id)
        page = {"job_buttons": []} if obj is None else self.page_context(request, obj)
        context = {**(extra_context or {}), **page}
        return super().change_view(request, object_id, form_url, context)


class JobActions(PageButtons):
    """The part of :class:`~django_jobs.admin.JobAdmin` that changes jobs: its actions, the
    job page's buttons and their URLs, deletion, and the permissions they check."""

    # -------------------------------------------------------------- permissions

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        if obj is not None and obj.state not in TERMINAL_STATES:
            return False
        return super().has_delete_permission(request, obj)

    def has_retry_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("django_jobs.retry_job")

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("django_jobs.cancel_job")

    def has_run_now_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("django_jobs.run_job_now")

    # -------------------------------------------------------------- deleting

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        # A small batch per statement, SKIP LOCKED, never one transaction over the selection.
        report = operator_actions.delete(queryset.filter(state__in=TERMINAL_STATES))
        if report.skipped:
            self.message_user(request, report.message("deleted"), messages.WARNING)

    @admin.action(description="Delete selected finished jobs", permissions=["delete"])
    def delete_selected(self, request: HttpRequest, queryset: QuerySet[Job]) -> Any:
        """Django's delete, with its confirmation page, of the selected jobs that have
        finished. An unfinished one is kept, and said so: never counted, nor recorded in the
        admin's history, as deleted."""
        if not request.POST.get("post"):  # the confirmation page, which counts what goes
            return django_delete_selected(self, request, queryset)
        kept = queryset.exclude(state__in=TERMINAL_STATES).count()
        response = django_delete_selected(self, request, queryset.filter(state__in=TERMINAL_STATES))
        if kept:
            self.message_user(
                request,
                f"{kept} unfinished job{'s' if kept != 1 else ''} kept: only finished jobs are "
                "deleted. Cancel a job first to delete it.",
                messages.WARNING,
            )
        return response

    def get_deleted_objects(self, objs: Any, request: HttpRequest) -> tuple[Any, ...]:
        """The confirmation page's summary, counted in SQL: Django's own would load every
        selected job and its attempts into memory to list them."""
        if isinstance(objs, QuerySet):
            ids: Iterable[int] = objs.values_list("pk", flat=True)
        else:
            ids = [obj.pk for obj in objs]
        jobs = Job.objects.filter(pk__in=ids, state__in=TERMINAL_STATES)
        counts = {
            "jobs (finished; unfinished ones are kept)": jobs.count(),
            "attempts": Attempt.objects.filter(job__in=jobs).count(),
        }
        perms_needed = set() if self.has_delete_permission(request) else {"job"}
        summary = [f"{n} {what}" for what, n in counts.items()]
        return summary, counts, perms_needed, []

    # -------------------------------------------------------------- actions

    PERMISSIONS = {
        "retry_selected": "retry",
        "retry_from_start_selected": "retry",
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

    @admin.action(
        description="Retry selected jobs (resume from any recorded steps)", permissions=["retry"]
    )
    def retry_selected(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        self._report(request, operator_actions.retry(queryset), "requeued")

    @admin.action(
        description="Retry selected jobs from the start (forget their steps and cursors)",
        permissions=["retry"],
    )
    def retry_from_start_selected(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        report = operator_actions.retry(queryset, from_start=True)
        self._report(request, report, "requeued from the start")

    @admin.action(description="Cancel selected jobs", permissions=["cancel"])
    def cancel_selected(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        self._report(request, operator_actions.cancel(queryset), "cancelled or asked to stop")

    @admin.action(description="Run selected pending jobs now", permissions=["run_now"])
    def run_selected_now(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        self._report(request, operator_actions.run_now(queryset), "made ready now")

    def _report(
        self, request: HttpRequest, report: operator_actions.ActionReport, done: str
    ) -> None:
        level = messages.SUCCESS if report.changed else messages.WARNING
        self.message_user(request, report.message(done), level)

    # -------------------------------------------------------------- the job page's buttons

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
                "<int:pk>/retry-from-start/",
                wrap(self.job_action_view),
                {"action": "retry_from_start_selected"},
                name="django_jobs_job_retry_from_start",
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
        allowed = getattr(self, f"has_{self.PERMISSIONS[action]}_permission")(request)
        return object_button(self, request, Job, pk, action, allowed)

    def page_context(self, request: HttpRequest, job: Job) -> dict[str, Any]:
        """The job page's buttons, its summary, its steps and cursors (``job_checkpoint``), and
        the live log of its running attempt (``?log_lines=`` of its last lines)."""
        checkpoint = job_checkpoint(job)
        running = job.attempts.filter(outcome="running").order_by("-number", "-id").first()
        wanted = job_id(request.GET.get("log_lines", "")) or LIVE_LINES
        return {
            "job_buttons": self.page_buttons(request, job, checkpoint),
            "job_checkpoint": checkpoint,
            "job_summary": job_summary(job),
            "job_live_log": live_log(running, wanted) if running and running.log else None,
        }

    def page_buttons(
        self, request: HttpRequest, job: Job, checkpoint: JobCheckpoint | None = None
    ) -> list[Button]:
        """The buttons of ``job``'s page that its state and the user's permissions allow. A job
        that kept steps or cursors has two retries: one resumes from them (and says so), the
        other forgets them. ``checkpoint``: the job's, if it was read already."""
        buttons: list[tuple[str, str, str] | tuple[str, str, str, str]] = []
        if job.state in RETRY.sources and self.has_retry_permission(request):
            buttons.extend(self._retry_buttons(checkpoint or job_checkpoint(job)))
        if job.state in CANCEL.sources and self.has_cancel_permission(request):
            buttons.append(("Cancel", "admin:django_jobs_job_cancel", ""))
        if job.state in RUN_NOW.sources and self.has_run_now_permission(request):
            buttons.append(("Run now", "admin:django_jobs_job_run_now", ""))
        return [
            Button(label, reverse(name, args=[job.pk]), *rest) for label, name, *rest in buttons
        ]

    @staticmethod
    def _retry_buttons(
        checkpoint: JobCheckpoint,
    ) -> list[tuple[str, str, str] | tuple[str, str, str, str]]:
        if checkpoint.empty:
            return [("Retry", "admin:django_jobs_job_retry", "")]
        kept = checkpoint.kept()
        return [
            (
                f"Retry (resume from {checkpoint.resumes_from()})",
                "admin:django_jobs_job_retry",
                f"Requeue the job: it resumes from its {kept}, a recorded step's result replayed "
                "instead of running the step again.",
            ),
            (
                "Retry from the start",
                "admin:django_jobs_job_retry_from_start",
                f"Requeue the job and forget its {kept}: it runs again from the beginning.",
                f"Forget this job's {kept} and run it again from the beginning?",
            ),
        ]


def object_button(
    model_admin: Any,
    request: HttpRequest,
    model: type[Model],
    pk: int,
    action: str,
    allowed: bool,
) -> HttpResponse:
    """A button on an object's page (a job's, a schedule's): POST only, refused unless
    ``allowed`` (the list action's permission); runs the list action ``action`` on that one
    object, then goes back to its page."""
    if request.method != "POST":
        return HttpResponse(status=405, headers={"Allow": "POST"})
    if not allowed:
        raise PermissionDenied
    obj = get_object_or_404(model, pk=pk)
    getattr(model_admin, action)(request, model._default_manager.filter(pk=obj.pk))
    opts = model._meta
    return HttpResponseRedirect(
        reverse(f"admin:{opts.app_label}_{opts.model_name}_change", args=[obj.pk])
    )
