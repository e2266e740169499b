"""The operator's admin through Django's test client: list, actions, permissions, job page."""

from __future__ import annotations

import pytest
from django.apps import apps
from django.contrib import admin
from django.db import connection
from django.test import Client, RequestFactory
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_jobs.models import Job
from tests.factories import AttemptFactory, JobFactory

pytestmark = pytest.mark.django_db

CHANGELIST = reverse("admin:django_jobs_job_changelist")


#: What every staff user of these tests may do besides what a test gives them: see the jobs.
VIEWER = ("view_job",)


def post_action(client: Client, action: str, jobs: list[Job], **extra: str):
    data = {"action": action, "_selected_action": [j.pk for j in jobs], **extra}
    return client.post(CHANGELIST, data, follow=True)


def messages_of(response) -> list[str]:
    return [str(m) for m in response.context["messages"]]


def test_the_list_shows_jobs_newest_first_with_badges(superuser) -> None:
    old = JobFactory(task="tests.echo")
    new = JobFactory(
        task="tests.fail", state="error", attempt=1, finished_at=old.created_at, max_attempts=1
    )
    response = superuser.get(CHANGELIST)
    assert response.status_code == 200
    ids = [job.pk for job in response.context["cl"].result_list]
    assert ids == [new.pk, old.pk]
    assert b'class="dj-badge dj-error"' in response.content
    assert b"attempt 1 of 1" in response.content


@pytest.mark.parametrize(
    "query",
    [
        "",
        "?state=error",
        "?queue=default",
        "?task=tests.echo",
        "?created=1h",
        "?finished=24h",
        "?q=tests.ec",
        "?q=42",
        "?q=some-pod",
        "?state=pending&q=tests",
        "?p=2",
    ],
)
def test_no_list_page_counts_the_whole_table(superuser, query) -> None:
    JobFactory.create_batch(3, task="tests.echo")
    with CaptureQueriesContext(connection) as queries:
        response = superuser.get(CHANGELIST + query)
    assert response.status_code in (200, 302)
    counts = [q["sql"] for q in queries if "COUNT(" in q["sql"].upper()]
    assert counts and all("LIMIT" in sql.upper() for sql in counts), counts
    assert not any("DISTINCT" in q["sql"].upper() for q in queries)


def test_filters_offer_fixed_choices(superuser) -> None:
    response = superuser.get(CHANGELIST)
    filters = {
        spec.title: [c["display"] for c in spec.choices(response.context["cl"])]
        for spec in response.context["cl"].filter_specs
    }
    assert filters["state"][1:] == [
        "Waiting", "Pending", "Scheduled", "Running", "Done", "Error", "Cancelled"
    ]  # fmt: skip
    assert filters["queue"][1:] == ["default", "reports", "imports"]
    assert "tests.echo" in filters["task"]


def test_search_by_id_task_prefix_worker_and_unique_key(superuser) -> None:
    a = JobFactory(task="reports.build")
    b = JobFactory(claimed=True, worker_id="pod-7f9:12:abcdef")
    c = JobFactory(unique_key="crawl:example.com")
    for term, expected in [
        (str(a.pk), a),
        ("reports.", a),
        ("pod-7f9", b),
        ("crawl:example.com", c),
    ]:
        result = list(superuser.get(CHANGELIST, {"q": term}).context["cl"].result_list)
        assert expected in result, term


def test_the_parent_filter_lists_a_jobs_children(superuser) -> None:
    parent = JobFactory()
    children = JobFactory.create_batch(2, parent=parent)
    JobFactory()
    response = superuser.get(CHANGELIST, {"parent": parent.pk})
    changelist = response.context["cl"]
    assert list(changelist.result_list) == children[::-1]
    assert "parent" in [spec.title for spec in changelist.filter_specs]  # shown, to be cleared


def test_retry_requeues_failed_jobs_and_reports_what_it_skipped(superuser) -> None:
    failed = [
        JobFactory(
            task="tests.fail",
            state="error",
            attempt=1,
            max_attempts=1,
            finished_at=JobFactory().created_at,
        )
        for _ in range(3)
    ]
    busy = [JobFactory(claimed=True) for _ in range(2)]
    response = post_action(superuser, "retry_selected", failed + busy)
    assert messages_of(response) == ["3 jobs requeued, 2 skipped: 2 running"]
    for job in failed:
        job.refresh_from_db()
        assert (job.state, job.attempt, job.max_attempts) == ("pending", 1, 2)


def test_cancel_and_run_now_actions(superuser) -> None:
    pending = JobFactory()
    later = JobFactory(run_after=pending.created_at.replace(year=2100))
    done = JobFactory(finished=True)
    response = post_action(superuser, "cancel_selected", [pending, done])
    assert messages_of(response) == ["1 job cancelled or asked to stop, 1 skipped: 1 done"]
    assert Job.objects.get(pk=pending.pk).state == "cancelled"
    response = post_action(superuser, "run_selected_now", [later])
    assert messages_of(response) == ["1 job made ready now"]
    assert Job.objects.get(pk=later.pk).run_after.year < 2100


def test_select_all_acts_on_the_whole_filtered_list_in_batches(superuser, monkeypatch) -> None:
    from django_jobs import operator_actions

    monkeypatch.setattr(operator_actions, "BATCH", 7)  # several batches from a small table
    created = JobFactory().created_at
    errors = [
        JobFactory(state="error", attempt=1, max_attempts=1, finished_at=created) for _ in range(20)
    ]
    others = JobFactory.create_batch(5)
    response = superuser.post(
        CHANGELIST + "?state=error",
        {"action": "retry_selected", "_selected_action": [errors[0].pk], "select_across": "1"},
        follow=True,
    )
    assert messages_of(response) == ["20 jobs requeued"]
    assert Job.objects.filter(pk__in=[j.pk for j in errors], state="pending").count() == 20
    assert Job.objects.filter(pk__in=[j.pk for j in others], state="pending").count() == 5


@pytest.mark.parametrize(
    ("perms", "action", "allowed"),
    [
        (["retry_job"], "retry_selected", True),
        (["cancel_job"], "cancel_selected", True),
        (["run_job_now"], "run_selected_now", True),
        (["cancel_job"], "retry_selected", False),
        (["retry_job"], "cancel_selected", False),
        ([], "retry_selected", False),
        ([], "cancel_selected", False),
        ([], "run_selected_now", False),
    ],
)
def test_each_action_needs_its_own_permission(staff, perms, action, allowed) -> None:
    client = staff(*VIEWER, *perms)
    job = JobFactory(state="error", attempt=1, max_attempts=1, finished_at=JobFactory().created_at)
    page = client.get(CHANGELIST)
    assert page.status_code == 200
    assert (f'value="{action}"' in page.content.decode()) is allowed
    response = client.post(CHANGELIST, {"action": action, "_selected_action": [job.pk]})
    if allowed:
        assert response.status_code == 302
    else:
        assert response.status_code == 403


def test_superuser_sees_every_action(superuser) -> None:
    content = superuser.get(CHANGELIST).content.decode()
    for action in ("retry_selected", "cancel_selected", "run_selected_now", "delete_selected"):
        assert f'value="{action}"' in content


def test_anonymous_users_are_sent_to_log_in() -> None:
    response = Client().get(CHANGELIST)
    assert response.status_code == 302 and "/login/" in response["Location"]
    job = JobFactory()
    response = Client().post(reverse("admin:django_jobs_job_cancel", args=[job.pk]))
    assert response.status_code == 302 and "/login/" in response["Location"]
    assert Job.objects.get(pk=job.pk).state == "pending"


def test_job_page_is_read_only_masks_secrets_and_shows_attempts(superuser) -> None:
    parent = JobFactory()
    job = JobFactory(
        state="error",
        attempt=1,
        max_attempts=1,
        finished_at=parent.created_at,
        parent=parent,
        kwargs={"user": "bob", "password": "hunter2", "nested": {"api_key": "sk-123"}},
        error="RuntimeError: login failed with token=abc123",
    )
    AttemptFactory(
        job=job,
        number=1,
        outcome="error",
        error="RuntimeError: boom",
        traceback='File "x.py"\n  connect("postgres://bob:hunter2@db/x")\nRuntimeError',
    )
    response = superuser.get(reverse("admin:django_jobs_job_change", args=[job.pk]))
    content = response.content.decode()
    assert response.status_code == 200
    assert "hunter2" not in content and "sk-123" not in content and "abc123" not in content
    assert "********" in content and "&quot;user&quot;: &quot;bob&quot;" in content
    assert "<details" in content and "traceback" in content  # collapsed traceback
    assert f"#{parent.pk}" in content  # link to the parent
    assert 'name="_save"' not in content  # nothing to edit
    assert "Retry</button>" in content and "Cancel</button>" not in content
    assert "enqueued" in content  # the timeline


def test_job_page_buttons_post_only_and_check_permissions(superuser, staff) -> None:
    job = JobFactory()
    url = reverse("admin:django_jobs_job_cancel", args=[job.pk])
    assert superuser.get(url).status_code == 405
    assert staff(*VIEWER, "retry_job").post(url).status_code == 403
    assert Job.objects.get(pk=job.pk).state == "pending"
    response = staff(*VIEWER, "cancel_job").post(url, follow=True)
    assert messages_of(response) == ["1 job cancelled or asked to stop"]
    assert Job.objects.get(pk=job.pk).state == "cancelled"


def test_only_finished_jobs_can_be_deleted(superuser) -> None:
    running = JobFactory(claimed=True)
    done = JobFactory(finished=True)
    assert (
        superuser.get(reverse("admin:django_jobs_job_delete", args=[running.pk])).status_code == 403
    )
    response = superuser.post(
        reverse("admin:django_jobs_job_delete", args=[done.pk]), {"post": "yes"}
    )
    assert response.status_code == 302
    assert list(Job.objects.values_list("pk", flat=True)) == [running.pk]


def test_nobody_can_add_or_edit_jobs(superuser) -> None:
    job = JobFactory()
    assert superuser.get(reverse("admin:django_jobs_job_add")).status_code == 403
    response = superuser.post(
        reverse("admin:django_jobs_job_change", args=[job.pk]), {"task": "evil", "state": "done"}
    )
    assert response.status_code == 403
    assert Job.objects.get(pk=job.pk).task == job.task


DASHBOARD = reverse("admin:django_jobs_dashboard_changelist")


def test_the_dashboard_shows_queues_workers_running_and_failing_jobs(superuser) -> None:
    from tests.factories import WorkerFactory

    worker = WorkerFactory(queues=["reports"], concurrency=2)
    JobFactory(queue="reports")
    JobFactory(claimed=True, worker_id=worker.id, task="tests.sleep")
    failed = JobFactory(
        task="tests.fail",
        state="error",
        attempt=1,
        max_attempts=1,
        finished_at=worker.started_at,
        error="ValueError: broken",
    )
    AttemptFactory(
        job=failed,
        number=1,
        outcome="error",
        finished_at=worker.started_at,
        error="ValueError: broken password=hunter2",
    )
    response = superuser.get(DASHBOARD)
    assert response.status_code == 200
    content = response.content.decode()
    assert 'id="dj-queues"' in content and "<td>reports</td>" in content.replace(
        '<a href="/admin/django_jobs/job/?queue=reports">reports</a>', "reports"
    )
    assert worker.id in content and "alive" in content
    assert "tests.sleep" in content  # running jobs
    assert "tests.fail" in content  # top failing tasks and recent failures
    assert "hunter2" not in content
    assert 'http-equiv="refresh"' in content
    index = superuser.get(reverse("admin:index")).content.decode()
    assert DASHBOARD in index  # reached from the admin index


def test_the_dashboard_needs_the_view_permission(staff) -> None:
    assert staff(*VIEWER).get(DASHBOARD).status_code == 200
    assert staff().get(DASHBOARD).status_code == 403


NASTY_SEARCHES = [
    "#²",
    "²",
    "①",
    "#",
    "##",
    "#-1",
    "-1",
    "#99999999999999999999999",
    "9223372036854775808",  # one past the largest bigint
    "9223372036854775807",
    "\x00",
    "tests.\x00echo",
    "x" * 100_000,
    "%",
    "_",
    "'",
    '"',
    "\\",
    "٣",
    "#٣",
    "\U0001d7d7",  # MATHEMATICAL BOLD DIGIT NINE, which int() reads as 9
    "\u202e",
    " \t\n",
]
# Every list of the app in the admin.
CHANGELISTS = [
    reverse(f"admin:django_jobs_{model._meta.model_name}_changelist")
    for model in apps.get_app_config("django_jobs").get_models()
    if admin.site.is_registered(model)
]


@pytest.mark.parametrize("url", CHANGELISTS)
@pytest.mark.parametrize("term", NASTY_SEARCHES, ids=ascii)
def test_no_search_term_makes_a_list_fail(superuser, url, term) -> None:
    JobFactory(task="tests.echo")
    assert superuser.get(url, {"q": term}).status_code == 200


@pytest.mark.parametrize("url", CHANGELISTS)
def test_undecodable_search_bytes_do_not_make_a_list_fail(superuser, url) -> None:
    # A lone surrogate (here in the bytes UTF-8 would give it) and bytes that are not UTF-8
    # at all: the client cannot encode a lone surrogate itself.
    for raw in ("%ED%A0%80", "%FF", "%C0%80", "%00"):
        assert superuser.get(f"{url}?q={raw}").status_code == 200, raw


@pytest.mark.parametrize("term", NASTY_SEARCHES, ids=ascii)
def test_no_search_term_makes_the_autocomplete_fail(superuser, term) -> None:
    JobFactory(task="tests.echo")
    query = {"app_label": "django_jobs", "model_name": "job", "field_name": "parent", "term": term}
    assert superuser.get(reverse("admin:autocomplete"), query).status_code == 200


@pytest.mark.parametrize("parameter", ["state", "queue", "task", "created", "finished", "parent"])
@pytest.mark.parametrize("value", ["²", "#²", "-1", "99999999999999999999999", "x" * 10_000])
def test_no_filter_value_makes_the_list_fail(superuser, parameter, value) -> None:
    JobFactory(task="tests.echo")
    assert superuser.get(CHANGELIST, {parameter: value}).status_code == 200


@pytest.mark.parametrize(
    "parameter", ["state", "queue", "task", "parent", "worker_id", "task__startswith", "id"]
)
def test_a_nul_in_a_filter_is_a_bad_request(superuser, parameter) -> None:
    """PostgreSQL text cannot hold a NUL, and the driver refuses to send one."""
    assert superuser.get(CHANGELIST, {parameter: "a\x00b"}).status_code == 400


def test_a_search_by_id_takes_ascii_digits_only(superuser) -> None:
    job = JobFactory(task="tests.echo")
    arabic_indic = str(job.pk).translate(str.maketrans("0123456789", "٠١٢٣٤٥٦٧٨٩"))
    for term in (str(job.pk), f"#{job.pk}"):
        assert list(superuser.get(CHANGELIST, {"q": term}).context["cl"].result_list) == [job]
    for term in (f"#{job.pk}²", arabic_indic, f"#{arabic_indic}"):
        assert list(superuser.get(CHANGELIST, {"q": term}).context["cl"].result_list) == []


def test_a_lone_surrogate_finds_nothing() -> None:
    """PostgreSQL text cannot hold one (nor a NUL), so no job matches it. (Through HTTP, Django
    decodes none; other callers of the search pass it the term as they got it.)"""
    JobFactory(task="tests.echo")
    job_admin = admin.site.get_model_admin(Job)
    request = RequestFactory().get("/")
    for term in ("\ud800", "tests.\udfff", "tests.\x00"):
        queryset, _ = job_admin.get_search_results(request, Job.objects.all(), term)
        assert list(queryset) == [], ascii(term)


def test_the_admin_retries_from_the_start_and_shows_a_jobs_steps_and_cursors(superuser) -> None:
    # README, "Operators choose": "The admin's retry resumes from the recorded steps and
    # cursors; 'Retry from the start' forgets them first ... The job page lists the steps (name,
    # the attempt that recorded it, when, how long, the result's size) and the cursors".
    from django_jobs.models import Step

    job = JobFactory(
        task="tests.five_steps",
        state="error",
        attempt=1,
        max_attempts=1,
        finished_at="2026-01-01T00:00Z",
    )
    Step.objects.create(job=job, name="download the file", attempt=1, result=1, result_bytes=1)
    Job.objects.filter(pk=job.pk).update(
        cursors={"next_row": {"value": 41, "attempt": 1, "saved_at": "2026-01-01T00:00Z"}}
    )
    page = superuser.get(reverse("admin:django_jobs_job_change", args=[job.pk]))
    assert b"download the file" in page.content
    assert b"next_row" in page.content
    actions = superuser.get(CHANGELIST).context["action_form"].fields["action"].choices
    from_start = [name for name, label in actions if "start" in str(label).lower()]
    assert from_start, actions
    post_action(superuser, from_start[0], [job])
    job.refresh_from_db()
    assert job.state == "pending"
    assert not Step.objects.filter(job_id=job.pk).exists() and job.cursors is None


# ------------------------------------------------------------------ the console's job list


def test_a_job_delayed_by_run_after_is_scheduled_not_pending(superuser) -> None:
    from datetime import timedelta

    from django.utils import timezone

    ready = JobFactory(task="tests.echo")
    later = JobFactory(task="tests.echo", run_after=timezone.now() + timedelta(hours=2))
    response = superuser.get(CHANGELIST)
    content = response.content.decode()
    assert content.count('class="dj-badge dj-scheduled"') == 1
    assert content.count('class="dj-badge dj-pending"') == 1
    assert 'class="dj-muted dj-run-after">at <time' in content

    def listed(state: str) -> list[Job]:
        return list(superuser.get(CHANGELIST, {"state": state}).context["cl"].result_list)

    assert listed("scheduled") == [later]
    assert listed("pending") == [ready]


def test_the_error_column_shows_the_first_line_masked_and_shortened(superuser) -> None:
    long_line = "ValueError: postgres://bob:hunter2@db/x refused " + "x" * 200
    JobFactory(state="error", attempt=1, finished_at=JobFactory().created_at,
               error=f"\n{long_line}\nsecond line")  # fmt: skip
    content = superuser.get(CHANGELIST).content.decode()
    assert "hunter2" not in content and "second line" not in content
    head = content.split('class="dj-error-head" title="', 1)[1]
    title, shown = head.split('">', 1)
    assert title.startswith("ValueError: postgres://bob:********@db/x refused xxx")
    assert title.endswith("x" * 20)
    assert shown.split("</span>", 1)[0].endswith("x…")


def test_list_times_carry_seconds_with_the_full_timestamp_on_hover(superuser) -> None:
    from django.utils import timezone

    job = JobFactory(finished=True)
    local = timezone.localtime(job.created_at)
    content = superuser.get(CHANGELIST).content.decode()
    assert f'title="{local.isoformat(timespec="milliseconds")}"' in content
    assert f">{local:%Y-%m-%d %H:%M:%S}</time>" in content
    assert "<dt>finished</dt>" in content and "<dt>waited</dt>" in content
    assert "<dt>ran</dt>" in content


def test_state_tabs_count_each_state_and_say_about_past_the_exact_limit(
    superuser, monkeypatch
) -> None:
    from datetime import timedelta

    from django.utils import timezone

    from django_jobs.admin import listing

    JobFactory.create_batch(3, finished=True)
    JobFactory(run_after=timezone.now() + timedelta(days=1))
    JobFactory()
    tabs = {t.state: t for t in superuser.get(CHANGELIST).context["state_tabs"]}
    assert (tabs[""].count, tabs["done"].count) == (5, 3)
    assert (tabs["pending"].count, tabs["scheduled"].count, tabs["error"].count) == (1, 1, 0)
    assert all(t.exact for t in tabs.values())
    assert tabs["done"].url == "?state=done"

    monkeypatch.setattr(listing, "EXACT_LIMIT", 2)
    response = superuser.get(CHANGELIST, {"queue": "default"})
    tabs = {t.state: t for t in response.context["state_tabs"]}
    assert not tabs["done"].exact and tabs["done"].shown_count.startswith("about ")
    assert tabs["pending"].shown_count == "1"
    assert "queue=default" in tabs["done"].url and "state=done" in tabs["done"].url
    assert 'id="dj-result-count">about ' in response.content.decode()


def test_state_tabs_count_within_the_lists_other_filters_and_its_search(superuser) -> None:
    JobFactory.create_batch(2, queue="reports", finished=True)
    JobFactory(queue="reports", task="tests.echo")
    JobFactory.create_batch(3, queue="default", finished=True)
    JobFactory(queue="default", state="error", attempt=1, max_attempts=1, finished=True)

    response = superuser.get(CHANGELIST, {"queue": "reports"})
    tabs = {t.state: t for t in response.context["state_tabs"]}
    assert (tabs[""].count, tabs["done"].count, tabs["pending"].count) == (3, 2, 1)
    assert tabs["error"].count == 0

    # The selected state narrows the list, never its own tabs' counts.
    response = superuser.get(CHANGELIST, {"queue": "default", "state": "error"})
    tabs = {t.state: t for t in response.context["state_tabs"]}
    assert (tabs[""].count, tabs["done"].count, tabs["error"].count) == (4, 3, 1)
    assert tabs["error"].selected and len(response.context["cl"].result_list) == 1

    response = superuser.get(CHANGELIST, {"q": "tests.ec"})
    tabs = {t.state: t for t in response.context["state_tabs"]}
    assert (tabs[""].count, tabs["pending"].count, tabs["done"].count) == (1, 1, 0)


def test_a_refused_argument_search_warns_once(superuser) -> None:
    response = superuser.get(CHANGELIST, {"q": "password=hunter2", "state": "done"})
    warnings = [str(m) for m in response.context["messages"]]
    assert len(warnings) == 1, warnings


def test_the_result_count_is_not_labelled_about_when_it_is_exact(superuser) -> None:
    JobFactory.create_batch(2)
    content = superuser.get(CHANGELIST).content.decode()
    assert 'id="dj-result-count">2 jobs' in content and "estimated" not in content


def test_an_argument_search_finds_jobs_by_keyword_or_positional_value(superuser) -> None:
    by_int = JobFactory(kwargs={"report_id": 7, "name": "quarterly"})
    by_text = JobFactory(kwargs={"report_id": "7"})
    by_arg = JobFactory(args=["quarterly", 3])
    JobFactory(kwargs={"report_id": 8})

    def found(term: str) -> set[Job]:
        response = superuser.get(CHANGELIST, {"q": term})
        assert response.status_code == 200, term
        return set(response.context["cl"].result_list)

    assert found("report_id=7") == {by_int, by_text}
    assert found('report_id="7"') == {by_text}
    assert found("name=quarterly") == {by_int, by_arg}
    assert found('name="quarterly"') == {by_int, by_arg}
    assert found("name=Quarterly") == set()


def test_an_argument_search_looks_at_the_newest_jobs_only(superuser, monkeypatch) -> None:
    from django_jobs.admin import listing

    old = JobFactory(kwargs={"feed": 1})
    new = JobFactory(kwargs={"feed": 1})
    monkeypatch.setattr(listing, "ARGUMENT_SEARCH_DEPTH", 1)
    assert list(superuser.get(CHANGELIST, {"q": "feed=1"}).context["cl"].result_list) == [new]
    assert old.pk < new.pk


def test_an_argument_search_refuses_masked_keys_and_values(superuser) -> None:
    JobFactory(kwargs={"api_key": "sk-live-123", "dsn": "postgres://bob:hunter2@db/x"})
    for term in ("api_key=sk-live-123", "password=s", "dsn=postgres://bob:hunter2@db/x"):
        response = superuser.get(CHANGELIST, {"q": term}, follow=True)
        assert list(response.context["cl"].result_list) == [], term
        assert any("cannot be searched" in m for m in messages_of(response)), term


@pytest.mark.parametrize(
    "term",
    [
        "a=" + "x" * 600,
        "a=[1, {",
        'a={"b": [1, 2]}',
        "a=NaN",
        "a=1e999",
        "a=" + "9" * 400,
        "=7",
        "a==",
        'a="\\ud800"',
    ],
)
def test_a_hostile_argument_search_finds_nothing_and_never_fails(superuser, term) -> None:
    JobFactory(kwargs={"a": 1})
    response = superuser.get(CHANGELIST, {"q": term})
    assert response.status_code == 200
    assert list(response.context["cl"].result_list) == []


def test_a_search_with_a_nul_character_is_refused_with_a_message(superuser) -> None:
    JobFactory(kwargs={"a": 1})
    response = superuser.get(CHANGELIST, {"q": "a=\x00"})
    assert response.status_code == 200
    assert "Null characters are not allowed." in messages_of(response)


# ------------------------------------------------------------------ the console's job page

EXECUTOR_TRACEBACK = """Traceback (most recent call last):
  File "/srv/app/venv/lib/python3.12/site-packages/django_jobs/worker/executor.py", line 80, in run
    result = call(job)
             ^^^^^^^^^
  File "/srv/app/venv/lib/python3.12/site-packages/django_jobs/worker/executor.py", line 41, in call
    return function(*args, **kwargs)
  File "/srv/app/reports/tasks.py", line 12, in build
    connect("postgres://bob:hunter2@db/x")
ValueError: feed 3 is broken"""


def test_a_failed_jobs_page_opens_with_a_summary_and_its_traceback_open(superuser) -> None:
    parent = JobFactory(task="reports.parent", state="waiting", attempt=1)
    job = JobFactory(
        task="reports.build", state="error", attempt=2, max_attempts=3, parent=parent,
        started_at=parent.created_at, finished_at=parent.created_at,
        worker_id="pod-7:1:abc", error="ValueError: feed 3 is broken",
    )  # fmt: skip
    AttemptFactory(job=job, number=1, outcome="error", error="old", traceback="old traceback")
    AttemptFactory(job=job, number=2, outcome="error", error=job.error,
                   traceback=EXECUTOR_TRACEBACK)  # fmt: skip
    JobFactory.create_batch(2, parent=job)
    content = superuser.get(reverse("admin:django_jobs_job_change", args=[job.pk])).content
    page = content.decode()
    summary = page.split('id="dj-summary"', 1)[1].split("</dl>", 1)[0]
    assert "2 of 3" in summary and "reports.build" in summary and "pod-7:1:abc" in summary
    assert f'href="{CHANGELIST}?parent={job.pk}">2 children</a>' in summary
    assert (
        f'parent <a href="{reverse("admin:django_jobs_job_change", args=[parent.pk])}"' in summary
    )
    assert '<a href="#dj-traceback">traceback' in page
    assert '<details class="dj-traceback dj-last-traceback" id="dj-traceback" open>' in page
    last = page.split('id="dj-traceback"', 1)[1].split("</div></details>", 1)[0]
    assert "<summary>2 django-jobs frames</summary>" in last
    assert "reports/tasks.py" in last and "old traceback" not in last
    assert "hunter2" not in page


def test_a_traceback_is_shown_closed_for_a_job_that_is_retrying(superuser) -> None:
    job = JobFactory(state="pending", attempt=1, error="ValueError: feed 3 is broken")
    AttemptFactory(job=job, number=1, outcome="error", error=job.error,
                   traceback=EXECUTOR_TRACEBACK)  # fmt: skip
    page = superuser.get(reverse("admin:django_jobs_job_change", args=[job.pk])).content.decode()
    assert '<details class="dj-traceback dj-last-traceback" id="dj-traceback">' in page


def test_the_own_frames_are_folded_in_linear_time() -> None:
    import time

    from django_jobs.admin.masking import folded_traceback, frames
    from tests.timing import CPU_BOUND

    own = '  File "/x/django_jobs/worker/executor.py", line 1, in run\n    call()\n'
    text = "Traceback (most recent call last):\n" + own * 3 + '  File "app.py", line 2\nE: x'
    runs = frames(text)
    assert [(o, len(lines)) for o, lines in runs] == [(False, 1), (True, 6), (False, 2)]
    hostile = ('  File "' + "/django_jobs/" * 20_000 + "\n") * 10 + " " * 200_000 + "x"
    # Milliseconds of this thread's CPU time (other processes on the cores do not add to it);
    # a fold quadratic in these 2.8 MB would take hours.
    started = time.thread_time()
    folded_traceback(hostile)
    assert time.thread_time() - started < CPU_BOUND


def test_a_running_jobs_live_log_shows_its_newest_lines_and_more_on_request(superuser) -> None:
    from django_jobs.admin.display import LIVE_LINES

    job = JobFactory(claimed=True)
    log = "\n".join(f"line {i}" for i in range(1, 501))
    AttemptFactory(job=job, number=1, outcome="running", log=log)
    url = reverse("admin:django_jobs_job_change", args=[job.pk])
    page = superuser.get(url).content.decode()
    live = page.split('id="dj-live-log"', 1)[1].split("</fieldset>", 1)[0]
    assert f"last {LIVE_LINES} of 500 lines" in live
    assert "line 500</pre>" in live and "line 300\n" not in live and "line 301\n" in live
    assert f'href="?log_lines={2 * LIVE_LINES}#dj-live-log"' in live
    live = superuser.get(url, {"log_lines": "400"}).content.decode().split('id="dj-live-log"')[1]
    assert "last 400 of 500 lines" in live and "line 101\n" in live and "line 100\n" not in live
    for hostile in ("-5", "abc", "99999999999999999999999"):
        assert superuser.get(url, {"log_lines": hostile}).status_code == 200


def test_the_job_page_shows_its_times_to_the_second_and_labels_its_controls(superuser) -> None:
    from django.utils import timezone

    job = JobFactory(finished=True, error="")
    AttemptFactory(job=job, number=1, outcome="done", started_at=job.started_at,
                   finished_at=job.finished_at)  # fmt: skip
    page = superuser.get(reverse("admin:django_jobs_job_change", args=[job.pk])).content.decode()
    for when in (job.created_at, job.started_at, job.finished_at):
        local = timezone.localtime(when)
        shown = f'title="{local.isoformat(timespec="milliseconds")}">{local:%Y-%m-%d %H:%M:%S}'
        assert shown in page
    assert page.count(f">{timezone.localtime(job.started_at):%Y-%m-%d %H:%M:%S}</time>") >= 2
    assert "<label>Controls:</label>" in page and "<label>Error:</label>" in page
