"""The dashboard page, listed in the admin index beside the jobs: one page over the proxy model
:class:`~django_jobs.models.Dashboard`, filled by :func:`django_jobs.store.overview.context`.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse

from django_jobs import queues
from django_jobs.exceptions import InvalidOption
from django_jobs.store import overview as dashboard_data


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
        name = f"{self.opts.app_label}_{self.opts.model_name}"
        return [
            path("", self.admin_site.admin_view(self.changelist_view), name=f"{name}_changelist"),
            path(
                "queues/<path:queue>/<str:action>/",
                self.admin_site.admin_view(self.queue_control_view),
                name=f"{name}_queue_control",
            ),
        ]

    def queue_control_view(self, request: HttpRequest, queue: str, action: str) -> HttpResponse:
        """The dashboard's pause and resume buttons (POST; ``django_jobs.pause_queue``)."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not request.user.has_perm("django_jobs.pause_queue") or action not in (
            "pause",
            "resume",
        ):
            raise PermissionDenied
        try:
            if action == "pause":
                reason = request.POST.get("reason", "")
                queues.pause(queue, by=request.user.get_username(), reason=reason)
            else:
                queues.resume(queue)
        except InvalidOption as error:
            messages.error(request, str(error))
        else:
            messages.success(request, f"Queue {queue} {action}d.")
        return HttpResponseRedirect(reverse("admin:django_jobs_dashboard_changelist"))

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        context = {
            **self.admin_site.each_context(request),
            **dashboard_data.context(),
            "title": "Jobs dashboard",
            "can_pause_queues": request.user.has_perm("django_jobs.pause_queue"),
            "opts": self.model._meta,
            **(extra_context or {}),
        }
        return TemplateResponse(request, "admin/django_jobs/dashboard.html", context)
