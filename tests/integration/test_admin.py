"""The operator's admin through Django's test client: list, actions, permissions, job page."""

from __future__ import annotations

import pytest
from django.apps import apps
from django.contrib import admin
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test import Client, RequestFactory
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_jobs.models import Job
from tests.factories import AttemptFactory, JobFactory

pytestmark = pytest.mark.django_db

CHANGELIST = reverse("admin:django_jobs_job_changelist")


def staff(*perms: str) -> Client:
    user = User.objects.create_user(
        f"staff-{'-'.join(perms) or 'none'}", password="x", is_staff=True
    )
    codenames = ["view_job", *perms]
    user.user_permissions.set(Permission.objects.filter(codename__in=codenames))
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def superuser() -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("root", password="x"))
    return client


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
    assert b"1/1" in response.content


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
    assert filters["state"][1:] == ["Waiting", "Pending", "Running", "Done", "Error", "Cancelled"]
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
def test_each_action_needs_its_own_permission(perms, action, allowed) -> None:
    client = staff(*perms)
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


def test_job_page_buttons_post_only_and_check_permissions(superuser) -> None:
    job = JobFactory()
    url = reverse("admin:django_jobs_job_cancel", args=[job.pk])
    assert superuser.get(url).status_code == 405
    assert staff("retry_job").post(url).status_code == 403
    assert Job.objects.get(pk=job.pk).state == "pending"
    response = staff("cancel_job").post(url, follow=True)
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


def test_the_dashboard_needs_the_view_permission() -> None:
    assert staff().get(DASHBOARD).status_code == 200
    nobody = User.objects.create_user("nobody", password="x", is_staff=True)
    client = Client()
    client.force_login(nobody)
    assert client.get(DASHBOARD).status_code == 403


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
