"""The dashboard page: one page over the proxy model :class:`~django_jobs.models.Dashboard`,
filled by :func:`django_jobs.store.overview.context`. It is not a model row of the admin index:
the index links to it above the apps (:func:`link_from_index`).
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, register_converter, reverse
from django.urls.converters import PathConverter, get_converters
from django.utils.http import url_has_allowed_host_and_scheme

from django_jobs import conf, queues
from django_jobs.exceptions import InvalidOption
from django_jobs.models.queue_control import Queue
from django_jobs.store import db
from django_jobs.store import overview as dashboard_data

#: The queue buttons and the permission each needs.
QUEUE_ACTIONS = {
    "pause": "django_jobs.pause_queue",
    "resume": "django_jobs.pause_queue",
    "limit": "django_jobs.change_queue",
}


def _limit(text: str) -> int | None:
    """A limit typed in the form: empty for none, else a whole number (checked by
    :func:`queues.set_limit`)."""
    text = text.strip()
    if not text:
        return None
    if not text.isascii() or not text.isdigit():
        raise InvalidOption(f"a limit is a whole number from 1 up, or empty for none, not {text!r}")
    return int(text)


class QueueName(PathConverter):
    """A queue's name in a URL: any characters, ``/`` and line breaks included (Django's
    ``path`` takes no line break), so that every queue a job names has its buttons."""

    regex = r"[\s\S]+"


if "jobs_queue" not in get_converters():  # once: Django 6 refuses to register a name twice
    register_converter(QueueName, "jobs_queue")


class DashboardAdmin(admin.ModelAdmin):
    """The dashboard page: queues, throughput, workers, running, stuck and failing jobs, from
    the same SQL views as the Grafana dashboard and from the rollups. Anyone who may view jobs
    may view it; pausing needs ``django_jobs.pause_queue``, a queue's limit
    ``django_jobs.change_queue``."""

    def has_module_permission(self, request: HttpRequest) -> bool:
        return False  # no model row on the index: the index links to the page instead

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
                "queues/<jobs_queue:queue>/<str:action>/",
                self.admin_site.admin_view(self.queue_control_view),
                name=f"{name}_queue_control",
            ),
        ]

    def queue_control_view(self, request: HttpRequest, queue: str, action: str) -> HttpResponse:
        """The dashboard's and the queues page's buttons (POST): pause and resume
        (``django_jobs.pause_queue``), and the limit (``django_jobs.change_queue``; empty for
        none). A bad value is a message and changes nothing. Back to ``next`` when it is a page
        of this site, else to the dashboard."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        needed = QUEUE_ACTIONS.get(action)
        if needed is None or not request.user.has_perm(needed):
            raise PermissionDenied
        try:
            if action == "pause":
                reason = request.POST.get("reason", "")
                queues.pause(queue, by=request.user.get_username(), reason=reason)
                done = f"Queue {queue} paused."
            elif action == "resume":
                queues.resume(queue)
                done = f"Queue {queue} resumed."
            else:
                limit = _limit(request.POST.get("limit", ""))
                db.commit_durably(conf.database_alias())  # under ATOMIC_REQUESTS
                queues.set_limit(queue, limit, source=Queue.LimitSource.ADMIN)
                done = f"Queue {queue}: " + (
                    "no limit." if limit is None else f"at most {limit} running jobs."
                )
        except InvalidOption as error:
            messages.error(request, str(error))
        else:
            messages.success(request, done)
        back = request.POST.get("next", "")
        if not url_has_allowed_host_and_scheme(
            back, allowed_hosts={request.get_host()}, require_https=request.is_secure()
        ):
            back = reverse("admin:django_jobs_dashboard_changelist")
        return HttpResponseRedirect(back)

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        context = {
            **self.admin_site.each_context(request),
            **dashboard_data.context(request.GET.get("range")),
            "title": "Jobs dashboard",
            "can_pause_queues": request.user.has_perm("django_jobs.pause_queue"),
            "can_limit_queues": request.user.has_perm("django_jobs.change_queue"),
            "back": request.get_full_path(),
            "opts": self.model._meta,
            **(extra_context or {}),
        }
        return TemplateResponse(request, "admin/django_jobs/dashboard.html", context)


#: The admin index with the dashboard's link above the apps; it extends ``admin/index.html``.
INDEX_TEMPLATE = "admin/django_jobs/index.html"


def link_from_index(site: admin.AdminSite) -> None:
    """Show the dashboard's link on ``site``'s index, unless the project has an index template
    of its own (then it may link to ``admin:django_jobs_dashboard_changelist`` itself)."""
    if site.index_template is None:
        site.index_template = INDEX_TEMPLATE
