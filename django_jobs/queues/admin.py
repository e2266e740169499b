"""The admin of queue controls: which queues are paused (by whom, when, why) and each queue's
cluster-wide limit, with pause and resume as list actions (permission
``django_jobs.pause_queue``) and the limit editable (``django_jobs.change_queue``). The dashboard
has the same pause and resume buttons (:mod:`~django_jobs.admin.dashboard`).

The page lists every queue first (registered, configured, having jobs, or having controls) with
its counts from the operations views and the dashboard's pause and limit buttons, then the rows
of controls. A row of controls exists for queues that are or were paused or limited; a queue
without one is open and unlimited. A limit set here wins over ``JOBS_QUEUE_LIMITS`` until it is
set back to the setting's (``manage.py jobqueue limit NAME settings``).
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils.http import urlencode

from django_jobs import conf, queues
from django_jobs.admin.actions import CheckedSelection
from django_jobs.admin.display import badge, moment
from django_jobs.exceptions import InvalidOption
from django_jobs.models.queue_control import Queue
from django_jobs.rates import Rate, parse_rate, spell
from django_jobs.store import db, overview
from django_jobs.store import operations_views as stats


class QueueForm(forms.ModelForm):
    #: The queue's rate limit, spelled as JOBS_QUEUE_RATE_LIMITS spells it; saved through
    #: queues.set_rate (the rate_limit and rate_period columns).
    rate = forms.CharField(
        required=False,
        max_length=40,
        label="Rate limit",
        help_text="At most N of the queue's jobs start in any window of this length, across all "
        'workers: "100/m", "10/s", "5/30m". Empty: no rate limit.',
    )

    class Meta:
        model = Queue
        fields = ["name", "concurrency_limit"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.instance.rate_limit and self.instance.rate_period:
            self.fields["rate"].initial = spell(self.instance.rate_limit, self.instance.rate_period)

    def clean_rate(self) -> Rate | None:
        text = self.cleaned_data["rate"].strip()
        if not text:
            return None
        try:
            return parse_rate(text, "rate limit")
        except InvalidOption as error:
            raise forms.ValidationError(str(error)) from None

    def clean_name(self) -> str:
        name = self.cleaned_data["name"]
        if self.instance._state.adding and name not in queues.known():
            raise forms.ValidationError(
                "No job, task, worker or JOBS_QUEUE_LIMITS entry names this queue."
            )
        return str(name)

    def clean_concurrency_limit(self) -> int | None:
        try:
            return queues.check_limit(self.cleaned_data["concurrency_limit"])
        except InvalidOption as error:
            raise forms.ValidationError(str(error)) from None


@admin.register(Queue)
class QueueAdmin(CheckedSelection):
    form = QueueForm
    list_display = ["name", "state", "paused_by", "paused_when", "pause_reason", "limit"]
    list_filter = ["paused"]
    search_fields = ["name"]
    actions = ["pause_queues", "resume_queues"]
    readonly_fields = [
        "paused",
        "paused_by",
        "paused_at",
        "pause_reason",
        "limit_source",
        "rate_text",
    ]

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is None:  # a new row: a queue to limit (pausing is an action)
            return ["name", "concurrency_limit", "rate"]
        return [
            "name",
            "concurrency_limit",
            "limit_source",
            "rate",
            "rate_text",
            *self.readonly_fields[:4],
        ]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [*self.readonly_fields, "name"] if obj is not None else []

    @admin.display(description="state", ordering="paused")
    def state(self, obj: Queue) -> Any:
        return badge("cancelled", "paused") if obj.paused else badge("done", "open")

    @admin.display(description="paused at", ordering="paused_at")
    def paused_when(self, obj: Queue) -> Any:
        return moment(obj.paused_at)

    @admin.display(description="limit", ordering="concurrency_limit")
    def limit(self, obj: Queue) -> str:
        if obj.concurrency_limit is None:
            return "-"
        source = " (JOBS_QUEUE_LIMITS)" if obj.limit_source == Queue.LimitSource.SETTINGS else ""
        return f"{obj.concurrency_limit}{source}"

    @admin.display(description="rate limit now")
    def rate_text(self, obj: Queue) -> str:
        if not obj.rate_limit or not obj.rate_period:
            return "none"
        source = (
            " (JOBS_QUEUE_RATE_LIMITS)" if obj.rate_source == Queue.LimitSource.SETTINGS else ""
        )
        return spell(obj.rate_limit, obj.rate_period) + source

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        controls = dict(Queue.objects.values_list("name", "pk"))
        every = []
        for queue in overview.queue_rows(stats.summary(window_minutes=overview.WINDOW_MINUTES)):
            pk = controls.get(queue["queue"])
            url = (
                reverse("admin:django_jobs_queue_add") + "?" + urlencode({"name": queue["queue"]})
                if pk is None
                else reverse("admin:django_jobs_queue_change", args=[pk])
            )
            every.append({**queue, "controls_url": url})
        context = {
            "queues": every,
            "controls_links": True,
            "summary": {"window_minutes": overview.WINDOW_MINUTES},
            "can_pause_queues": request.user.has_perm("django_jobs.pause_queue"),
            "can_limit_queues": request.user.has_perm("django_jobs.change_queue"),
            "back": request.get_full_path(),
            **(extra_context or {}),
        }
        return super().changelist_view(request, context)

    def has_pause_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("django_jobs.pause_queue")

    def save_model(self, request: HttpRequest, obj: Queue, form: Any, change: bool) -> None:
        # Through queues.set_limit: the same checks as jobqueue, and idle workers are woken.
        db.commit_durably(conf.database_alias())  # the admin's transaction: a crash keeps it
        queues.set_limit(obj.name, obj.concurrency_limit, source=Queue.LimitSource.ADMIN)
        if "rate" in form.changed_data:
            queues.set_rate(obj.name, form.cleaned_data["rate"], source=Queue.LimitSource.ADMIN)
        obj.refresh_from_db()

    @admin.action(description="Pause selected queues", permissions=["pause"])
    def pause_queues(self, request: HttpRequest, queryset: QuerySet[Queue]) -> None:
        db.commit_durably(conf.database_alias())  # under ATOMIC_REQUESTS
        names = list(queryset.values_list("name", flat=True))
        for name in names:
            queues.pause(name, by=request.user.get_username())
        self.message_user(request, f"Paused {len(names)} queue(s): {', '.join(names)}.")

    @admin.action(description="Resume selected queues", permissions=["pause"])
    def resume_queues(self, request: HttpRequest, queryset: QuerySet[Queue]) -> None:
        db.commit_durably(conf.database_alias())  # under ATOMIC_REQUESTS
        names = list(queryset.filter(paused=True).values_list("name", flat=True))
        for name in names:
            queues.resume(name)
        self.message_user(
            request,
            f"Resumed {len(names)} queue(s)" + (f": {', '.join(names)}." if names else "."),
            messages.SUCCESS,
        )
