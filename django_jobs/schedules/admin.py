"""The admin of periodic jobs: the schedules with their next and last runs, pause, resume and run
now (list actions and buttons on a schedule's page, each with its permission), and a form to add
schedules of any registered task (:mod:`~django_jobs.schedules.forms`), which reads the
expression and zone as they are typed (``preview/``, fetched by ``schedules.js``).

A schedule declared in code (``JOBS_SCHEDULES``, ``@job(schedule=...)``) can be paused, resumed
and run from here, not edited: its code-owned fields are read-only. One that is no longer
declared is flagged *removed from code*; it no longer fires, and may be deleted.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.db.models import Exists, OuterRef, QuerySet
from django.db.models.constants import LOOKUP_SEP
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

from django_jobs import conf
from django_jobs.admin.actions import Button, PageButtons, object_button
from django_jobs.admin.display import badge
from django_jobs.admin.listing import storable
from django_jobs.admin.masking import masked_json, masked_text
from django_jobs.exceptions import InvalidOption, JobsError
from django_jobs.models.job import Job
from django_jobs.models.schedule import Schedule
from django_jobs.schedules import cron, reading, ticks
from django_jobs.schedules.forms import CODE_OWNED, ScheduleForm
from django_jobs.schedules.ticks import EDITABLE
from django_jobs.store import db

CODE_NOTE = (
    "Declared in code (JOBS_SCHEDULES or @job(schedule=...)): operators may pause, resume or run "
    "it now here, not edit it. Change it in the code, then deploy or run syncschedules."
)
#: What the page shows of a schedule's state: never edited by hand.
STATE_FIELDS = [
    ("next_run", "last_run", "last_outcome_text"),
    ("paused_text", "source", "removed"),
    ("created_at", "updated_at"),
]


class RemovedFilter(admin.SimpleListFilter):
    """Code schedules no longer declared in code (they no longer fire)."""

    title = "removed from code"
    parameter_name = "removed"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("yes", "Removed from code"), ("no", "Declared or added here")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> QuerySet[Schedule]:
        if self.value() in ("yes", "no"):
            return queryset.filter(missing_from_code_since__isnull=self.value() == "no")
        return queryset


@admin.register(Schedule)
class ScheduleAdmin(PageButtons):
    form = ScheduleForm
    # The job page's template: its object tools are the buttons passed as ``job_buttons``.
    # with the schedule's reading (its expression in words, its next runs) above the fields.
    change_form_template = "admin/django_jobs/schedule/change_form.html"
    list_display = [
        "name",
        "task_name",
        "when",
        "next_run",
        "last_run",
        "last_outcome_text",
        "paused_text",
        "source_text",
    ]
    list_filter = ["paused", "source", RemovedFilter]
    search_fields = ["name", "task"]
    ordering = ["name"]
    actions = ["pause_selected", "resume_selected", "run_selected_now"]

    class Media:
        css = {"all": ["django_jobs/admin.css", "django_jobs/schedules.css"]}
        js = ["django_jobs/schedules.js"]

    # -------------------------------------------------------------- the rows

    #: Fields shown masked: never filtered on, which would reveal them a letter at a time
    #: (``?kwargs__password__startswith=h``), as the job list refuses too.
    MASKED_FIELDS = {"args", "kwargs", "last_outcome"}

    def lookup_allowed(self, lookup: str, value: str, request: HttpRequest) -> bool:
        if lookup.split(LOOKUP_SEP)[0] in self.MASKED_FIELDS or not storable(value):
            return False
        return super().lookup_allowed(lookup, value, request)

    # -------------------------------------------------------------- the columns

    def get_queryset(self, request: HttpRequest) -> QuerySet[Schedule]:
        # Whether the last job still exists, for the whole page in the same query: it may
        # have been pruned.
        jobs = Job.objects.filter(pk=OuterRef("last_job_id"))
        return super().get_queryset(request).annotate(last_job_exists=Exists(jobs))

    @admin.display(description="task", ordering="task")
    def task_name(self, schedule: Schedule) -> SafeString:
        # A dotted name may break after its dots, never inside a word.
        parts = schedule.task.split(".")
        return format_html_join(mark_safe(".<wbr>"), "{}", ((part,) for part in parts))

    @admin.display(description="source", ordering="source")
    def source_text(self, schedule: Schedule) -> SafeString | str:
        """Where the schedule is declared, flagged when code no longer declares it."""
        if schedule.missing_from_code_since is None:
            return schedule.source
        return self.removed(schedule)

    @admin.display(description="schedule", ordering="cron")
    def when(self, schedule: Schedule) -> SafeString:
        """The expression kept on one line, and under it the words it reads as and its zone."""
        words = reading.in_words(schedule.cron)
        said = f"{words}, " if words else ""
        return format_html(
            '<code class="dj-cron">{}</code><span class="dj-cron-words">{}{} time</span>',
            schedule.cron,
            said,
            schedule.timezone,
        )

    @admin.display(description="next run", ordering="next_run_at")
    def next_run(self, schedule: Schedule) -> SafeString | str:
        if schedule.next_run_at is None:
            return "-"
        return on_clocks(schedule.next_run_at, schedule.timezone)

    @admin.display(description="last run", ordering="last_run_at")
    def last_run(self, schedule: Schedule) -> SafeString | str:
        if schedule.last_run_at is None:
            return "-"
        when = on_clocks(schedule.last_run_at, schedule.timezone, seconds=True)
        if schedule.last_job_id is None:
            return when
        exists = getattr(schedule, "last_job_exists", None)
        if exists is None:  # a schedule not read through get_queryset
            exists = Job.objects.filter(pk=schedule.last_job_id).exists()
        if not exists:
            return format_html("{} · #{} (pruned)", when, schedule.last_job_id)
        url = reverse("admin:django_jobs_job_change", args=[schedule.last_job_id])
        return format_html('{} · <a href="{}">#{}</a>', when, url, schedule.last_job_id)

    @admin.display(description="last outcome")
    def last_outcome_text(self, schedule: Schedule) -> str:
        return masked_text(schedule.last_outcome)

    @admin.display(description="paused", ordering="paused")
    def paused_text(self, schedule: Schedule) -> SafeString | str:
        if not schedule.paused:
            return "no"
        by = f" by {schedule.paused_by}" if schedule.paused_by else ""
        if schedule.paused_at is None:
            return badge("cancelled", f"paused{by}")
        since = reading.clock(schedule.paused_at, schedule.timezone, timezone.now())
        return format_html(
            '{}<span class="dj-cron-words">since {}</span>',
            badge("cancelled", f"paused{by}"),
            since,
        )

    @admin.display(description="in code")
    def removed(self, schedule: Schedule) -> SafeString | str:
        if schedule.missing_from_code_since is None:
            return "yes" if schedule.source == "code" else "-"
        since = f"{schedule.missing_from_code_since:%Y-%m-%d %H:%M}"
        return badge("error", f"removed from code since {since}")

    @admin.display(description="args")
    def args_masked(self, schedule: Schedule) -> SafeString:
        return masked_json(schedule.args)

    @admin.display(description="kwargs")
    def kwargs_masked(self, schedule: Schedule) -> SafeString:
        return masked_json(schedule.kwargs)

    # -------------------------------------------------------------- the page and its form

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # A schedule declared in code is changed in the code: its page is read-only.
        if obj is not None and obj.source == "code":
            return False
        return super().has_change_permission(request, obj)

    def _locked(self, request: HttpRequest, obj: Schedule | None) -> bool:
        """Whether the page shows the code-owned fields read-only (the arguments masked)."""
        return obj is not None and not self.has_change_permission(request, obj)

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        locked = self._locked(request, obj)
        payload = ("args_masked", "kwargs_masked") if locked else ("args", "kwargs")
        main: dict[str, Any] = {
            "fields": [
                "name",
                "task",
                ("cron", "timezone"),
                *payload,
                ("queue", "priority"),
                ("catch_up", "overlap", "when_queue_paused"),
            ]
        }
        if obj is not None and obj.source == "code":
            main["description"] = CODE_NOTE
        if obj is None:
            return [(None, main)]
        return [(None, main), ("State", {"fields": STATE_FIELDS})]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is None:
            return []
        state = [name for row in STATE_FIELDS for name in row]
        if not self._locked(request, obj):
            return state
        # "args" and "kwargs" too, though shown masked instead: the form then drops them.
        return [*CODE_OWNED, "args_masked", "kwargs_masked", *state]

    def render_change_form(
        self,
        request: HttpRequest,
        context: dict[str, Any],
        add: bool = False,
        change: bool = False,
        form_url: str = "",
        obj: Schedule | None = None,
    ) -> HttpResponse:
        # The form's expression and zone as typed, when they are valid (a preview before
        # saving); otherwise the saved schedule's.
        form = context["adminform"].form
        typed = form.cleaned_data if form.is_bound and hasattr(form, "cleaned_data") else {}
        expression = typed.get("cron") or (obj.cron if obj is not None else "")
        zone_name = typed.get("timezone") or (obj.timezone if obj is not None else "")
        context["schedule_reading"] = Reading.of(expression, zone_name)
        if "cron" in form.fields:  # typed here, not declared in code: read as it is typed
            context["schedule_preview_url"] = reverse("admin:django_jobs_schedule_preview")
        return super().render_change_form(request, context, add, change, form_url, obj)

    def save_model(self, request: HttpRequest, obj: Schedule, form: Any, change: bool) -> None:
        db.commit_durably(conf.database_alias())  # the admin's transaction: a crash keeps it
        if not change:
            obj.source = "admin"
            super().save_model(request, obj, form, change)
            obj.recompute_next_run()
            return
        # An edit writes only the fields the form changed, in one statement under the row's
        # lock: a pause, a run or a next tick that a scheduler or another operator wrote since
        # the form was read stays as they wrote it. The next run moves only when the time it
        # depends on changed, and a tick already due still fires (ticks.edit).
        changed = {name: getattr(obj, name) for name in form.changed_data if name in EDITABLE}
        if changed:
            ticks.edit(obj.pk, changed)
        obj.refresh_from_db()

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # A schedule still declared in code would come back at the next sync.
        if obj is not None and obj.source == "code" and obj.missing_from_code_since is None:
            return False
        return super().has_delete_permission(request, obj)

    # -------------------------------------------------------------- permissions

    def has_pause_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("django_jobs.pause_schedule")

    def has_run_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("django_jobs.run_schedule")

    PERMISSIONS = {
        "pause_selected": "pause",
        "resume_selected": "pause",
        "run_selected_now": "run",
    }

    def _allowed(self, request: HttpRequest, action: str) -> bool:
        return bool(getattr(self, f"has_{self.PERMISSIONS[action]}_permission")(request))

    # -------------------------------------------------------------- actions

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        # Django ignores a posted action the user may not run; it is refused outright instead.
        action = request.POST.get("action", "") if request.method == "POST" else ""
        if action in self.PERMISSIONS and not self._allowed(request, action):
            raise PermissionDenied
        return super().changelist_view(request, extra_context)

    @admin.action(description="Pause selected schedules", permissions=["pause"])
    def pause_selected(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        by = request.user.get_username()
        self._each(request, queryset, lambda s: s.pause(by), "paused")

    @admin.action(description="Resume selected schedules", permissions=["pause"])
    def resume_selected(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        self._each(request, queryset, Schedule.resume, "resumed")

    @admin.action(description="Run selected schedules now", permissions=["run"])
    def run_selected_now(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        def run(schedule: Schedule) -> None:
            job = schedule.run_now()
            url = reverse("admin:django_jobs_job_change", args=[job.pk])
            message = format_html(
                'Schedule “{}” run now: <a href="{}">job #{}</a>', schedule.name, url, job.pk
            )
            self.message_user(request, message, messages.SUCCESS)

        self._each(request, queryset, run, "")

    def _each(
        self,
        request: HttpRequest,
        queryset: QuerySet[Schedule],
        act: Callable[[Schedule], Any],
        done: str,
    ) -> None:
        """Apply ``act`` to each schedule, then report what was done and what failed."""
        names = []
        for schedule in queryset.order_by("name"):
            try:
                act(schedule)
            except JobsError as error:
                self.message_user(request, f"“{schedule.name}”: {error}", messages.ERROR)
            else:
                names.append(schedule.name)
        if done and names:
            plural = "s" if len(names) > 1 else ""
            listed = ", ".join(names)
            self.message_user(request, f"Schedule{plural} {done}: {listed}", messages.SUCCESS)

    # -------------------------------------------------------------- a schedule's buttons

    def get_urls(self) -> list[URLPattern]:
        # Every page runs outside ATOMIC_REQUESTS' transaction, as the job admin's do: each
        # pause, resume or run is its own short transaction, never one over the selection.
        non_atomic = transaction.non_atomic_requests(using=conf.database_alias())
        view = self.admin_site.admin_view(self.schedule_action_view)
        preview = self.admin_site.admin_view(self.preview_view)
        urls = [
            path("preview/", preview, name="django_jobs_schedule_preview"),
            *(
                path(f"<int:pk>/{slug}/", view, {"action": action}, name=url_name(slug))
                for slug, action in BUTTONS.values()
            ),
            *super().get_urls(),
        ]
        for pattern in urls:
            non_atomic(pattern.callback)
        return urls

    def schedule_action_view(self, request: HttpRequest, pk: int, action: str) -> HttpResponse:
        """The buttons on a schedule's page: POST only, same permissions as the actions."""
        return object_button(self, request, Schedule, pk, action, self._allowed(request, action))

    def preview_view(self, request: HttpRequest) -> HttpResponse:
        """The form's "When it runs", for the expression and zone as typed (``?cron=`` and
        ``?timezone=``), before anything is saved: their words and next runs, or what is wrong
        with them. For whoever may add or change a schedule; it reads and writes nothing."""
        if request.method != "GET":
            return HttpResponseNotAllowed(["GET"])
        if not (self.has_add_permission(request) or self.has_change_permission(request)):
            raise PermissionDenied
        expression = request.GET.get("cron", "").strip()
        zone_name = request.GET.get("timezone", "").strip()
        problem = typed_problem(expression, zone_name)
        context = {
            "schedule_reading": None if problem else Reading.of(expression, zone_name),
            "schedule_problem": problem,
        }
        return TemplateResponse(request, "admin/django_jobs/schedule/reading.html", context)

    def page_buttons(self, request: HttpRequest, schedule: Schedule) -> list[Button]:
        """The buttons of ``schedule``'s page: pause or resume, and run now, as allowed."""
        buttons = []
        for label, (slug, action) in BUTTONS.items():
            if label == ("Pause" if schedule.paused else "Resume"):
                continue
            if self._allowed(request, action):
                buttons.append(
                    Button(label, reverse(f"admin:{url_name(slug)}", args=[schedule.pk]))
                )
        return buttons


def on_clocks(moment: datetime, zone_name: str, seconds: bool = False) -> SafeString:
    """``moment`` on the schedule's clock with its zone named, and under it the server's time
    (``settings.TIME_ZONE``) when that clock reads differently; the full timestamp on hover."""
    now = timezone.now()
    server = timezone.get_default_timezone_name()
    try:
        shown = reading.clock(moment, zone_name, now, seconds)
    except (ValueError, KeyError):  # a zone this system does not know: the server's clock
        zone_name, shown = server, reading.clock(moment, server, now, seconds)
    beside = ""
    if reading.reads_differently(moment, zone_name, server):
        beside = format_html(
            '<span class="dj-server-time">server: {}</span>',
            reading.clock(moment, server, now, seconds),
        )
    return format_html(
        '<time class="dj-clock" datetime="{}" title="{}">{}</time>{}',
        moment.isoformat(),
        f"{moment.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC",
        shown,
        beside,
    )


def typed_problem(expression: str, zone_name: str) -> str:
    """What keeps a typed expression and zone from being read ("" when nothing does), in the
    words the form's own check uses."""
    if not expression:
        return "Type a cron expression and a time zone: their next runs show here."
    for name, value in (("cron", expression), ("timezone", zone_name)):
        longest = LENGTHS[name]
        if len(value) > longest:
            return f"The {name} field takes at most {longest} characters."
        if not storable(value):
            return f"The {name} field holds a character that cannot be stored."
    try:
        cron.expand(expression)
        cron.zone(zone_name)
    except InvalidOption as error:
        return str(error)
    return ""


@dataclasses.dataclass(frozen=True)
class Reading:
    """What a schedule's page shows above its fields: the expression in words, its zone, and
    the next fire times on its clock and the server's."""

    expression: str
    zone: str
    words: str | None
    server_zone: str
    #: The next fire times, each shown on the schedule's clock (and the server's).
    upcoming: list[SafeString]

    @classmethod
    def of(cls, expression: str, zone_name: str) -> Reading | None:
        if not expression or not zone_name:
            return None
        moments = reading.upcoming(expression, zone_name, timezone.now(), count=UPCOMING)
        return cls(
            expression=expression,
            zone=zone_name,
            words=reading.in_words(expression),
            server_zone=timezone.get_default_timezone_name(),
            upcoming=[on_clocks(moment, zone_name) for moment in moments],
        )


#: How many of a schedule's next fire times its page lists.
UPCOMING = 5
#: The longest expression and zone name a schedule holds (their columns' lengths).
LENGTHS = {"cron": Schedule.cron.field.max_length or 0,
           "timezone": Schedule.timezone.field.max_length or 0}  # fmt: skip

#: The buttons of a schedule's page: label → (URL slug, action).
BUTTONS = {
    "Pause": ("pause", "pause_selected"),
    "Resume": ("resume", "resume_selected"),
    "Run now": ("run-now", "run_selected_now"),
}


def url_name(slug: str) -> str:
    """The URL name of a schedule's button (``django_jobs_schedule_run_now``)."""
    return f"django_jobs_schedule_{slug.replace('-', '_')}"
