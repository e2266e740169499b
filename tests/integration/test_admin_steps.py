"""A long job's steps and cursors in the admin: listed on its page (masked, bounded), resumed
from by a retry and forgotten by a retry from the start, each with the retry permission; and the
page of a job that finished despite a cancel request."""

from __future__ import annotations

import uuid
from html.parser import HTMLParser
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from django_jobs.admin import checkpoint
from django_jobs.context import JobContext
from django_jobs.models import Job, Step
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db

CHANGELIST = reverse("admin:django_jobs_job_changelist")


def page_url(job: Job) -> str:
    return reverse("admin:django_jobs_job_change", args=[job.pk])


def messages_of(response) -> list[str]:
    return [str(m) for m in response.context["messages"]]


class Tables(HTMLParser):
    """The text of each cell of the tables with an id, by id: ``{id: [[cell, ...], ...]}``."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.tables: dict[str, list[list[str]]] = {}
        self._table: str | None = None
        self._cell: list[str] | None = None
        self.feed(html)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "table" and (name := dict(attrs).get("id")):
            self._table = name
            self.tables[name] = []
        elif self._table and tag == "tr":
            self.tables[self._table].append([])
        elif self._table and tag == "td":
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "table":
            self._table = None
        elif tag == "td" and self._table and self._cell is not None:
            self.tables[self._table][-1].append("".join(self._cell).strip())
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def rows(html: str, table: str) -> list[list[str]]:
    return [row for row in Tables(html).tables.get(table, []) if row]  # without the header


def failed_job(**fields: Any) -> Job:
    """A job that ended in error on its last attempt, after two, having kept its work."""
    job = JobFactory(
        state="error",
        attempt=2,
        max_attempts=2,
        started_at=timezone.now(),
        finished_at=timezone.now(),
        worker_id="pod-x:1:abcdef",
        **fields,
    )
    Step.objects.create(job=job, name="fetch", attempt=1, result=[1, 2], result_bytes=5)
    Step.objects.create(
        job=job, name="render", attempt=2, result="x" * 1534, result_bytes=1536, duration=2.5
    )
    saved_at = timezone.now().isoformat()
    job.cursors = {
        "page": {"value": 7, "attempt": 2, "saved_at": saved_at},
        "login": {
            "value": {"user": "bob", "password": "hunter2", "dsn": "postgres://bob:pw-zz@db/x"},
            "attempt": 1,
            "saved_at": saved_at,
        },
        "api_token": {"value": "tok-secret", "attempt": 2, "saved_at": saved_at},
    }
    job.save(update_fields=["cursors"])
    return job


def test_the_job_page_lists_steps_and_cursors_with_masked_values(superuser) -> None:
    job = failed_job()
    content = superuser.get(page_url(job)).content.decode()
    steps = rows(content, "dj-steps")
    assert [(name, attempt, took, size) for name, attempt, _, took, size in steps] == [
        ("fetch", "1", "0.00s", "5 B"),
        ("render", "2", "2.50s", "1.5 KiB"),
    ]
    assert all(len(recorded) == len("2026-01-01 00:00:00.000") for _, _, recorded, _, _ in steps)
    cursors = {name: (value, attempt) for name, value, attempt, _ in rows(content, "dj-cursors")}
    assert cursors == {
        "api_token": ('"********"', "2"),
        "login": (
            '{"dsn": "postgres://bob:********@db/x", "password": "********", "user": "bob"}',
            "1",
        ),
        "page": ("7", "2"),
    }
    assert "hunter2" not in content and "tok-secret" not in content and "pw-zz" not in content
    assert "x" * 100 not in content  # no step's result is shown
    assert "Steps and cursors" in content and "Steps <span" in content
    assert 'id="dj-steps-left-out"' not in content  # every step is listed


@pytest.mark.django_db(transaction=True)
def test_the_page_shows_what_a_run_recorded_through_its_context(superuser) -> None:
    job = JobFactory(claimed=True, lease=str(uuid.uuid4()), max_attempts=2)
    run = JobContext(
        job_id=job.pk,
        task=job.task,
        attempt=job.attempt,
        max_attempts=job.max_attempts,
        worker_id=job.worker_id,
        lease=str(job.lease),
    )
    run.step("download", lambda: {"rows": 3})
    run.save_cursor("offset", 300)
    content = superuser.get(page_url(job)).content.decode()
    [(name, attempt, recorded, _, size)] = rows(content, "dj-steps")
    assert (name, attempt, size) == ("download", "1", "10 B")  # {"rows":3}
    [(name, value, attempt, saved)] = rows(content, "dj-cursors")
    assert (name, value, attempt) == ("offset", "300", "1")
    assert saved[:10] == recorded[:10] and len(saved) == len(recorded)  # parsed, then formatted
    assert "Retry" not in content  # running: nothing to retry


def test_a_job_without_steps_or_cursors_has_no_such_section(superuser) -> None:
    job = JobFactory(state="error", attempt=1, max_attempts=1, finished_at=timezone.now())
    content = superuser.get(page_url(job)).content.decode()
    assert 'id="dj-checkpoint"' not in content
    assert ">Retry</button>" in content and "Retry from the start" not in content


def test_a_job_with_cursors_only_says_it_has_no_steps(superuser) -> None:
    job = JobFactory(state="cancelled", attempt=1, finished_at=timezone.now())
    job.cursors = {"page": {"value": 1, "attempt": 1, "saved_at": timezone.now().isoformat()}}
    job.save(update_fields=["cursors"])
    content = superuser.get(page_url(job)).content.decode()
    assert 'id="dj-no-steps"' in content and rows(content, "dj-cursors")[0][:2] == ["page", "1"]
    assert ">Retry (resume from cursors)</button>" in content


def test_the_page_lists_the_last_steps_of_a_long_job_in_one_query(superuser) -> None:
    def queries_of(job: Job) -> tuple[list[str], str]:
        with CaptureQueriesContext(connection) as queries:
            response = superuser.get(page_url(job))
        assert response.status_code == 200
        return [q["sql"] for q in queries], response.content.decode()

    none, one, many = (failed_job() for _ in range(3))
    Step.objects.filter(job=none).delete()
    Step.objects.filter(job=one).exclude(name="fetch").delete()
    Step.objects.bulk_create(
        Step(job=many, name=f"page {i}", attempt=2, result=i, result_bytes=len(str(i)))
        for i in range(2_000)
    )
    superuser.get(page_url(none))  # Django's caches (content types) warmed
    counts = []
    for job in (none, one, many):
        sql, content = queries_of(job)
        counts.append(len(sql))
        on_steps = [q for q in sql if "django_jobs_step" in q]
        assert len(on_steps) == 1 and "LIMIT" in on_steps[0] and "result," not in on_steps[0]
    assert counts[0] == counts[1] == counts[2], counts
    assert counts[2] <= 15, counts
    listed = [name for name, *_ in rows(content, "dj-steps")]
    assert len(listed) == checkpoint.SHOWN == 200
    assert listed[0] == "page 1800" and listed[-1] == "page 1999"  # the last ones, in order
    assert "The last 200 of 2,002 steps; the 1,802 recorded before them are not shown" in content
    assert 'Steps <span class="dj-muted">(2,002)</span>' in content


def test_retry_resumes_and_retry_from_the_start_forgets_steps_and_cursors(superuser) -> None:
    kept, forgotten = failed_job(), failed_job()
    response = superuser.post(
        CHANGELIST,
        {"action": "retry_selected", "_selected_action": [kept.pk]},
        follow=True,
    )
    assert messages_of(response) == ["1 job requeued"]
    response = superuser.post(
        CHANGELIST,
        {"action": "retry_from_start_selected", "_selected_action": [forgotten.pk, kept.pk]},
        follow=True,
    )
    # The job requeued a moment ago is pending: skipped, and keeps its steps.
    assert messages_of(response) == ["1 job requeued from the start, 1 skipped: 1 pending"]
    kept.refresh_from_db()
    forgotten.refresh_from_db()
    assert (kept.state, forgotten.state) == ("pending", "pending")
    assert Step.objects.filter(job=kept).count() == 2 and set(kept.cursors) == {
        "page",
        "login",
        "api_token",
    }
    assert not Step.objects.filter(job=forgotten).exists() and forgotten.cursors is None


def test_the_job_page_offers_both_retries_and_each_button_does_its_own(superuser) -> None:
    kept, forgotten = failed_job(), failed_job()
    content = superuser.get(page_url(kept)).content.decode()
    assert ">Retry (resume from steps and cursors)</button>" in content
    assert ">Retry from the start</button>" in content
    assert 'title="Requeue the job and forget its 2 recorded steps and 3 cursors' in content
    retry = reverse("admin:django_jobs_job_retry", args=[kept.pk])
    response = superuser.post(retry, follow=True)
    assert messages_of(response) == ["1 job requeued"]
    assert Step.objects.filter(job=kept).count() == 2
    from_start = reverse("admin:django_jobs_job_retry_from_start", args=[forgotten.pk])
    assert superuser.get(from_start).status_code == 405
    response = superuser.post(from_start, follow=True)
    assert response.redirect_chain[-1][0] == page_url(forgotten)
    assert messages_of(response) == ["1 job requeued from the start"]
    assert not Step.objects.filter(job=forgotten).exists()
    assert Job.objects.get(pk=forgotten.pk).cursors is None
    content = response.content.decode()
    assert 'id="dj-checkpoint"' not in content  # nothing kept any more
    assert "Retry" not in content  # pending: nothing to retry


@pytest.mark.parametrize(
    ("perms", "allowed"),
    [(["retry_job"], True), (["cancel_job", "run_job_now"], False), ([], False)],
)
def test_both_retries_need_the_retry_permission(staff, perms, allowed) -> None:
    client = staff("view_job", *perms)
    jobs = {"retry_selected": failed_job(), "retry_from_start_selected": failed_job()}
    menu = client.get(CHANGELIST).content.decode()
    page = client.get(page_url(jobs["retry_selected"])).content.decode()
    assert 'id="dj-checkpoint"' in page  # anyone who may view the job sees its steps
    assert ("Retry from the start</button>" in page) is allowed
    assert ("Retry (resume" in page) is allowed
    for action, job in jobs.items():
        assert (f'value="{action}"' in menu) is allowed
        response = client.post(CHANGELIST, {"action": action, "_selected_action": [job.pk]})
        assert response.status_code == (302 if allowed else 403)
    for slug in ("retry", "retry_from_start"):
        job = failed_job()
        response = client.post(reverse(f"admin:django_jobs_job_{slug}", args=[job.pk]))
        assert response.status_code == (302 if allowed else 403)
        assert Job.objects.get(pk=job.pk).state == ("pending" if allowed else "error")
        assert Step.objects.filter(job=job).exists() is (slug == "retry" or not allowed)
    if not allowed:
        assert Step.objects.filter(job=jobs["retry_from_start_selected"]).count() == 2
        assert Job.objects.get(pk=jobs["retry_from_start_selected"].pk).state == "error"


def test_a_job_that_finished_despite_a_cancel_request_says_so(superuser) -> None:
    despite = JobFactory(finished=True, cancel_requested=True, result={"rows": 3})
    content = superuser.get(page_url(despite)).content.decode()
    assert "Finished despite the cancel request" in content
    assert "field-cancel_note" in content
    for job in (
        JobFactory(finished=True),
        JobFactory(claimed=True, cancel_requested=True),
        JobFactory(state="cancelled", cancel_requested=True, finished_at=timezone.now()),
    ):
        content = superuser.get(page_url(job)).content.decode()
        assert "Finished despite" not in content, job.state


def test_cancel_requested_reads_as_plain_words_not_a_red_cross(superuser) -> None:
    # "no" is muted, not an alarm; "yes" stands out.
    for requested, words in [
        (False, '<span class="dj-muted">no</span>'),
        (True, '<strong class="dj-flag">yes</strong>'),
    ]:
        job = JobFactory(claimed=True, cancel_requested=requested)
        content = superuser.get(page_url(job)).content.decode()
        assert "icon-no.svg" not in content and "icon-yes.svg" not in content
        assert f'<div class="readonly">{words}</div>' in content
