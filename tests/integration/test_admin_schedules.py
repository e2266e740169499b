"""The admin of periodic jobs through Django's test client: the add/edit form's checks, the
pause/resume/run-now permissions, and the list's columns (a pruned last job, a schedule removed
from code, masked secrets)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from django_jobs.models import Job, Schedule
from tests.factories import JobFactory, ScheduleFactory, UserFactory

pytestmark = pytest.mark.django_db

CHANGELIST = reverse("admin:django_jobs_schedule_changelist")
ADD = reverse("admin:django_jobs_schedule_add")


def change_url(schedule: Schedule) -> str:
    return reverse("admin:django_jobs_schedule_change", args=[schedule.pk])


def button_url(schedule: Schedule, slug: str) -> str:
    return reverse(f"admin:django_jobs_schedule_{slug}", args=[schedule.pk])


#: What every staff user of these tests may do besides what a test gives them: see, add and
#: change schedules, and see jobs.
EDITOR = ("view_schedule", "change_schedule", "add_schedule", "view_job")


def make_schedule(**fields: Any) -> Schedule:
    return ScheduleFactory(**{"name": "nightly", "cron": "0 3 * * *", **fields})


def form_data(**fields: str) -> dict[str, str]:
    data = {
        "name": "hourly-echo",
        "task": "tests.echo",
        "cron": "5 * * * *",
        "timezone": "Europe/Paris",
        "args": '["hello"]',
        "kwargs": '{"fmt": "csv"}',
        "queue": "",
        "priority": "",
        "catch_up": "skip",
        "overlap": "allow",
        "when_queue_paused": "skip",
    }
    data.update(fields)
    return data


def messages_of(response) -> list[str]:
    return [str(m) for m in response.context["messages"]]


# ------------------------------------------------------------------ the form


def test_a_valid_schedule_is_saved_from_the_admin_with_its_next_run(superuser) -> None:
    response = superuser.post(ADD, form_data(), follow=True)
    assert response.status_code == 200, response.content
    schedule = Schedule.objects.get(name="hourly-echo")
    assert schedule.source == "admin"
    assert (schedule.args, schedule.kwargs) == (["hello"], {"fmt": "csv"})
    assert schedule.timezone == "Europe/Paris"
    assert schedule.next_run_at is not None
    assert schedule.next_run_at > timezone.now()
    assert schedule.next_run_at.minute == 5


@pytest.mark.parametrize(
    ("field", "value", "error"),
    [
        ("cron", "61 * * * *", "cron"),
        ("cron", "every day", "cron"),
        ("cron", "@sometimes", "shortcut"),
        ("timezone", "Mars/Olympus", "timezone"),
        ("task", "tests.nonexistent", "Select a valid choice"),
        ("args", "[1, 2", "Enter a valid JSON"),
        ("args", '{"a": 1}', "Enter a JSON list"),
        ("kwargs", "[1]", "Enter a JSON dict"),
        ("kwargs", "{'single': 'quotes'}", "Enter a valid JSON"),
    ],
)
def test_an_invalid_field_is_an_error_on_that_field_and_saves_nothing(
    superuser, field, value, error
) -> None:
    response = superuser.post(ADD, form_data(**{field: value}))
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert list(errors) == [field], errors
    assert error.lower() in " ".join(errors[field]).lower()
    assert not Schedule.objects.exists()


def test_the_add_form_offers_registered_tasks_and_empty_arguments(superuser) -> None:
    form = superuser.get(ADD).context["adminform"].form
    choices = dict(form.fields["task"].choices)
    assert "tests.echo" in choices and "tests.fail" in choices
    assert (form["args"].value(), form["kwargs"].value()) == ("[]", "{}")


def test_editing_an_admin_schedule_recomputes_its_next_run(superuser) -> None:
    schedule = make_schedule(source="admin")
    data = form_data(name="nightly", cron="0 4 * * *", timezone="UTC")
    response = superuser.post(change_url(schedule), data, follow=True)
    assert response.status_code == 200
    schedule.refresh_from_db()
    assert schedule.cron == "0 4 * * *"
    assert (schedule.next_run_at.hour, schedule.next_run_at.minute) == (4, 0)


def test_masked_secrets_are_shown_masked_and_kept_when_saved_untouched(superuser) -> None:
    schedule = make_schedule(
        source="admin",
        args=["postgres://app:hunter2@db/app"],
        kwargs={"api_key": "sk-live-123", "feed": "a"},
    )
    page = superuser.get(change_url(schedule))
    content = page.content.decode()
    assert "sk-live-123" not in content and "hunter2" not in content
    assert "********" in content
    form = page.context["adminform"].form
    data = form_data(
        name="nightly",
        args=form["args"].value(),
        kwargs=form["kwargs"].value().replace('"a"', '"b"'),
    )
    superuser.post(change_url(schedule), data, follow=True)
    schedule.refresh_from_db()
    assert schedule.args == ["postgres://app:hunter2@db/app"]
    assert schedule.kwargs == {"api_key": "sk-live-123", "feed": "b"}


def test_a_code_schedule_is_read_only_and_says_why(superuser) -> None:
    schedule = make_schedule(source="code", kwargs={"password": "swordfish"})
    page = superuser.get(change_url(schedule))
    content = page.content.decode()
    assert "not edit it" in content
    assert "swordfish" not in content and "********" in content
    assert not page.context["adminform"].form.fields  # nothing editable
    superuser.post(change_url(schedule), form_data(name="renamed", cron="* * * * *"))
    schedule.refresh_from_db()
    assert (schedule.name, schedule.cron) == ("nightly", "0 3 * * *")


# ------------------------------------------------------------------ permissions and actions


@pytest.mark.parametrize(
    ("perms", "slug", "allowed"),
    [
        ((), "pause", False),
        (("run_schedule",), "pause", False),
        (("pause_schedule",), "pause", True),
        ((), "run_now", False),
        (("pause_schedule",), "run_now", False),
        (("run_schedule",), "run_now", True),
    ],
)
def test_each_button_needs_its_permission(staff, perms, slug, allowed) -> None:
    schedule = make_schedule()
    client = staff(*EDITOR, *perms)
    response = client.post(button_url(schedule, slug))
    assert response.status_code == (302 if allowed else 403)
    schedule.refresh_from_db()
    if slug == "pause":
        assert schedule.paused is allowed
    else:
        assert Job.objects.filter(task="tests.echo").exists() is allowed


@pytest.mark.parametrize(
    ("perms", "action"),
    [((), "pause_selected"), (("pause_schedule",), "run_selected_now"), ((), "resume_selected")],
)
def test_posting_an_action_without_its_permission_is_refused(staff, perms, action) -> None:
    schedule = make_schedule()
    data = {"action": action, "_selected_action": [schedule.pk]}
    assert staff(*EDITOR, *perms).post(CHANGELIST, data).status_code == 403


def test_the_buttons_are_post_only_and_shown_to_whom_may_use_them(superuser, staff) -> None:
    schedule = make_schedule()
    assert superuser.get(button_url(schedule, "pause")).status_code == 405
    page = superuser.get(change_url(schedule)).content.decode()
    assert button_url(schedule, "pause") in page and button_url(schedule, "run_now") in page
    assert button_url(schedule, "resume") not in page
    client = staff(*EDITOR)
    page = client.get(change_url(schedule)).content.decode()
    assert button_url(schedule, "pause") not in page and button_url(schedule, "run_now") not in page
    assert client.get(CHANGELIST).context["action_form"] is None  # no action it may run


def test_a_superuser_pauses_resumes_and_runs_schedules(superuser) -> None:
    first, second = make_schedule(), make_schedule(name="second")
    data = {"action": "pause_selected", "_selected_action": [first.pk, second.pk]}
    response = superuser.post(CHANGELIST, data, follow=True)
    assert messages_of(response) == ["Schedules paused: nightly, second"]
    first.refresh_from_db()
    assert first.paused and first.paused_by == "root" and first.paused_at is not None
    assert "paused by root" in superuser.get(CHANGELIST).content.decode()

    response = superuser.post(button_url(first, "resume"), follow=True)
    first.refresh_from_db()
    assert not first.paused and messages_of(response) == ["Schedule resumed: nightly"]

    response = superuser.post(button_url(first, "run_now"), follow=True)
    job = Job.objects.get(task="tests.echo")
    link = reverse("admin:django_jobs_job_change", args=[job.pk])
    assert f'<a href="{link}">job #{job.pk}</a>' in response.content.decode()
    first.refresh_from_db()
    assert first.last_job_id == job.pk


# ------------------------------------------------------------------ the list


def test_the_list_links_the_last_job_or_says_it_was_pruned(superuser) -> None:
    job = JobFactory(task="tests.echo")
    ran = timezone.now() - timedelta(hours=1)
    kept = make_schedule(name="kept", last_run_at=ran, last_job_id=job.pk, last_outcome="done")
    pruned = make_schedule(name="pruned", last_run_at=ran, last_job_id=job.pk + 1000)
    content = superuser.get(CHANGELIST).content.decode()
    link = reverse("admin:django_jobs_job_change", args=[job.pk])
    assert f'<a href="{link}">#{job.pk}</a>' in content
    assert f"#{pruned.last_job_id} (pruned)" in content
    assert reverse("admin:django_jobs_job_change", args=[pruned.last_job_id]) not in content
    assert kept.name in content


def test_a_schedule_removed_from_code_is_flagged_and_filtered(superuser) -> None:
    make_schedule(name="declared", source="code")
    make_schedule(name="gone", source="code", missing_from_code_since=timezone.now())
    make_schedule(name="typed-in", source="admin")
    response = superuser.get(CHANGELIST)
    assert response.content.decode().count("removed from code since") == 1

    def listed(query: str) -> list[str]:
        return [s.name for s in superuser.get(CHANGELIST + query).context["cl"].result_list]

    assert listed("?removed=yes") == ["gone"]
    assert listed("?removed=no") == ["declared", "typed-in"]
    assert listed("?source__exact=admin") == ["typed-in"]
    assert listed("?paused__exact=1") == []


def test_only_schedules_no_longer_in_code_or_added_here_can_be_deleted(superuser) -> None:
    declared = make_schedule(name="declared", source="code")
    gone = make_schedule(name="gone", source="code", missing_from_code_since=timezone.now())
    delete = "admin:django_jobs_schedule_delete"
    assert superuser.get(reverse(delete, args=[declared.pk])).status_code == 403
    assert superuser.get(reverse(delete, args=[gone.pk])).status_code == 200


def test_the_list_masks_secrets_in_the_last_outcome(superuser) -> None:
    make_schedule(last_outcome="error: connect to postgres://app:hunter2@db/app failed")
    content = superuser.get(CHANGELIST).content.decode()
    assert "hunter2" not in content and "********" in content


@pytest.mark.parametrize(
    "query",
    [
        "kwargs__api_key__startswith=sk",
        "args__0__contains=hunter",
        "last_outcome__contains=hunter2",
        "name=a%00b",
    ],
)
def test_the_list_cannot_be_filtered_on_masked_values(superuser, query) -> None:
    make_schedule(kwargs={"api_key": "sk-live-123"}, last_outcome="password=hunter2")
    assert superuser.get(f"{CHANGELIST}?{query}").status_code == 400


def test_an_edit_writes_only_what_it_changed_and_keeps_a_due_tick() -> None:
    # The operator opened the form; meanwhile another operator paused the schedule, and its
    # next tick came due. Saving a priority change must undo neither.
    from django.contrib import admin
    from django.test import RequestFactory

    schedule = make_schedule(source="admin", cron="0 3 * * *", timezone="UTC")
    opened = Schedule.objects.get(pk=schedule.pk)  # the row as the form read it
    Schedule.objects.get(pk=schedule.pk).pause("ops")
    due = timezone.now() - timedelta(minutes=1)
    Schedule.objects.filter(pk=schedule.pk).update(next_run_at=due)

    model_admin = admin.site._registry[Schedule]
    request = RequestFactory().post(change_url(schedule))
    request.user = UserFactory(username="root", superuser=True)
    form_class = model_admin.get_form(request, opened, change=True)
    data = form_data(name="nightly", cron="0 3 * * *", timezone="UTC", args="[]", kwargs="{}")
    form = form_class(data={**data, "priority": "5"}, instance=opened)
    assert form.is_valid(), form.errors
    model_admin.save_model(request, form.save(commit=False), form, change=True)

    schedule.refresh_from_db()
    assert schedule.priority == 5
    assert (schedule.paused, schedule.paused_by) == (True, "ops")
    assert schedule.next_run_at == due


def test_an_edit_of_the_cron_expression_keeps_a_tick_due_and_not_yet_fired(superuser) -> None:
    # The tick came due while the operator typed; the scheduler has not fired it yet. The new
    # expression applies from the tick after it, not from now.
    schedule = make_schedule(source="admin", cron="0 3 * * *", timezone="UTC")
    due = timezone.now() - timedelta(seconds=5)
    Schedule.objects.filter(pk=schedule.pk).update(next_run_at=due)
    data = form_data(name="nightly", cron="30 4 * * *", timezone="UTC", args="[]", kwargs="{}")
    response = superuser.post(change_url(schedule), data, follow=True)
    assert response.status_code == 200, response.content
    schedule.refresh_from_db()
    assert (schedule.cron, schedule.next_run_at) == ("30 4 * * *", due)


def test_the_form_sets_what_a_tick_does_while_the_queue_is_paused(superuser) -> None:
    assert b'name="when_queue_paused"' in superuser.get(ADD).content
    response = superuser.post(ADD, form_data(when_queue_paused="enqueue"), follow=True)
    assert response.status_code == 200, response.content
    assert Schedule.objects.get(name="hourly-echo").when_queue_paused == "enqueue"
    response = superuser.post(ADD, form_data(name="other", when_queue_paused="later"))
    assert b"Select a valid choice" in response.content
    assert not Schedule.objects.filter(name="other").exists()


# ------------------------------------------------------------------ times on the schedule's clock


def test_the_list_says_the_expression_in_words_and_the_next_run_on_the_schedules_clock(
    superuser,
) -> None:
    make_schedule(name="paris", cron="30 6 * * mon-fri", timezone="Europe/Paris")
    make_schedule(name="utc", cron="0 0 L * *", timezone="UTC")
    content = superuser.get(CHANGELIST).content.decode()
    assert '<code class="dj-cron">30 6 * * mon-fri</code>' in content
    assert "at 06:30, Monday to Friday, Europe/Paris time" in content
    assert "06:30 Europe/Paris</time>" in content
    # The server's clock (TIME_ZONE = "UTC") beside the Paris time only.
    assert content.count('class="dj-server-time"') == 1
    assert "05:30 UTC</span>" in content or "04:30 UTC</span>" in content
    # A shape not said in words: the expression and its zone, no words.
    assert '<code class="dj-cron">0 0 L * *</code><span class="dj-cron-words">UTC time' in content


def test_a_schedules_page_lists_its_next_five_runs_on_its_clock(superuser) -> None:
    schedule = make_schedule(cron="30 6 * * mon-fri", timezone="Europe/Paris")
    response = superuser.get(change_url(schedule))
    reading = response.context["schedule_reading"]
    assert (reading.words, reading.zone, reading.server_zone) == (
        "at 06:30, Monday to Friday",
        "Europe/Paris",
        "UTC",
    )
    assert len(reading.upcoming) == 5
    content = response.content.decode()
    assert content.count("06:30 Europe/Paris</time>") >= 5
    assert "(the server's is UTC)" in content
    assert '<ol class="dj-next-fires">' in content


def test_the_add_form_previews_a_valid_expression_after_a_post_with_other_errors(
    superuser,
) -> None:
    assert superuser.get(ADD).context["schedule_reading"] is None
    data = form_data(cron="0 9 1 * *", timezone="America/New_York", kwargs="[1]")
    response = superuser.post(ADD, data)
    assert list(response.context["adminform"].form.errors) == ["kwargs"]
    reading = response.context["schedule_reading"]
    assert reading.words == "at 09:00, on the 1st of each month"
    assert [moment.count("09:00 America/New_York") for moment in reading.upcoming] == [1] * 5
    assert not Schedule.objects.exists()


PREVIEW = reverse("admin:django_jobs_schedule_preview")


def test_the_preview_reads_what_is_typed_before_it_is_saved(superuser) -> None:
    response = superuser.get(PREVIEW, {"cron": "30 6 * * mon-fri", "timezone": "Europe/Paris"})
    assert response.status_code == 200 and "no-store" in response["Cache-Control"]
    content = response.content.decode()
    assert "at 06:30, Monday to Friday" in content
    assert content.count("06:30 Europe/Paris</time>") == 5
    assert "(the server's is UTC)" in content
    assert not Schedule.objects.exists()


@pytest.mark.parametrize(
    ("cron", "zone", "message"),
    [
        ("30 6 * *", "UTC", "has 4 field(s)"),
        ("61 * * * *", "UTC", "invalid cron expression"),
        ("0 3 * * *", "Mars/Olympus", "unknown timezone"),
        ("0 3 * * *", "../../etc/passwd", "unknown timezone"),
        ("0 3 * * *\x00", "UTC", "cannot be stored"),
        ("* " * 5000, "UTC", "at most 200 characters"),
        ("", "UTC", "Type a cron expression"),
        ("<script>alert(1)</script>", "UTC", "&lt;script&gt;"),
    ],
)
def test_the_preview_says_what_is_wrong_with_what_is_typed(superuser, cron, zone, message) -> None:
    response = superuser.get(PREVIEW, {"cron": cron, "timezone": zone})
    content = response.content.decode()
    assert response.status_code == 200 and message in content, content
    assert "<script>" not in content and "dj-next-fires" not in content


def test_the_preview_needs_the_right_to_add_or_change_a_schedule(staff) -> None:
    viewer = staff("view_schedule")
    assert viewer.get(PREVIEW, {"cron": "@daily", "timezone": "UTC"}).status_code == 403
    adder = staff(*EDITOR)
    assert adder.get(PREVIEW, {"cron": "@daily", "timezone": "UTC"}).status_code == 200
    assert Client().get(PREVIEW).status_code == 302  # to the login page
    assert adder.post(PREVIEW, {"cron": "@daily"}).status_code == 405


def test_the_add_form_has_the_preview_box_and_a_code_schedules_page_has_none(superuser) -> None:
    content = superuser.get(ADD).content.decode()
    assert f'data-dj-preview="{PREVIEW}"' in content and "django_jobs/schedules.js" in content
    content = superuser.get(change_url(make_schedule(source="code"))).content.decode()
    assert "at 03:00" in content and "data-dj-preview" not in content
