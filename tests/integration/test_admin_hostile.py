"""The console against odd and hostile requests: filters on masked values, raw lookups, odd
queue names and reasons, selections that are not ids. Each is a clear 4xx or a page that works,
never a 500, and changes nothing it should not."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.db import connection
from django.test import Client
from django.urls import reverse

from django_jobs.models import Job, Queue
from django_jobs.registry import registry
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db
CHANGELIST = reverse("admin:django_jobs_job_changelist")


@pytest.fixture
def client_options() -> dict[str, Any]:
    """The clients answer a server error with a 500 page, for the tests to see its status."""
    return {"raise_request_exception": False}


@pytest.fixture
def viewer(staff: Callable[..., Client]) -> Client:
    return staff("view_job")


def test_a_masked_cursor_cannot_be_read_a_letter_at_a_time_through_the_lists_filters(viewer):
    job = JobFactory(claimed=True, cursors={"api_token": {"value": "s3cret", "attempt": 1}})
    page = viewer.get(reverse("admin:django_jobs_job_change", args=[job.pk])).content.decode()
    assert "s3cret" not in page  # the job page masks the cursor ...
    found = {
        prefix: viewer.get(CHANGELIST, {"cursors__api_token__value__startswith": prefix})
        for prefix in ("s", "s3", "x")
    }
    # ... so the list must refuse a filter on it, as it refuses ?kwargs__password__startswith=
    assert {p: r.status_code for p, r in found.items()} == {"s": 400, "s3": 400, "x": 400}


@pytest.mark.parametrize("page", ["/admin/django_jobs/dashboard/", "/admin/django_jobs/queue/"])
def test_a_queue_name_with_a_newline_does_not_break_the_dashboard_and_queues_page(superuser, page):
    registry.get("tests.noop").using(queue="imports\nnightly").enqueue()  # accepted by enqueue
    with connection.cursor() as cursor:  # a name no enqueue takes, written by hand
        cursor.execute("UPDATE django_jobs_job SET queue = '' WHERE id = %s", [JobFactory().pk])
    assert superuser.get(page).status_code == 200
    url = reverse("admin:django_jobs_dashboard_queue_control", args=["imports\nnightly", "pause"])
    assert superuser.post(url, {"reason": "odd name"}).status_code == 302
    assert Queue.objects.get(name="imports\nnightly").paused


def test_a_pause_reason_with_a_nul_character_is_not_a_server_error(superuser):
    url = reverse("admin:django_jobs_dashboard_queue_control", args=["default", "pause"])
    response = superuser.post(url, {"reason": "deploy\x00"}, follow=True)
    assert response.status_code == 200
    assert any("NUL" in str(m) for m in response.context["messages"])
    assert not Queue.objects.filter(paused=True).exists()


@pytest.mark.parametrize(
    "query",
    [
        {"task__regex": "("},
        {"task__iregex": "["},
        {"created_at__year": "99999"},
        {"id__range": "1"},
        {"state": "error", "task__regex": "("},
    ],
)
def test_raw_lookups_in_the_lists_query_string_are_never_a_server_error(superuser, query):
    JobFactory()
    assert superuser.get(CHANGELIST, query).status_code == 400


def test_the_list_still_takes_plain_lookups_on_its_columns(superuser) -> None:
    low, high = JobFactory(priority=0), JobFactory(priority=5, worker_id="pod-7:1:abc")
    for query, expected in [
        ({"priority__gte": "1"}, [high]),
        ({"worker_id__startswith": "pod-7"}, [high]),
        ({"id__in": f"{low.pk},{high.pk}"}, [high, low]),
        ({"worker_id__isnull": "True"}, [low]),
        ({"created_at__lt": "2000-01-01"}, []),
        ({"created_at__gte": "2000-01-01", "priority__lte": "0"}, [low]),
    ]:
        response = superuser.get(CHANGELIST, query)
        assert response.status_code == 200, query
        assert list(response.context["cl"].result_list) == expected, query


@pytest.mark.parametrize("action", ["retry_selected", "cancel_selected", "delete_selected"])
@pytest.mark.parametrize("selected", ["abc", "1.5", "#1", "²", "-1", "99999999999999999999"])
def test_a_selected_id_that_is_not_a_number_is_a_bad_request(superuser, action, selected):
    job = JobFactory(state="error", attempt=1, max_attempts=1, finished=True)
    data = {"action": action, "_selected_action": [str(job.pk), selected], "post": "yes"}
    response = superuser.post(CHANGELIST, data)
    assert response.status_code == 400 and b"_selected_action" in response.content
    job.refresh_from_db()
    assert job.state == "error"  # nothing done


@pytest.mark.parametrize(
    ("url", "action", "selected"),
    [
        ("/admin/django_jobs/schedule/", "pause_selected", "abc"),
        ("/admin/django_jobs/apitoken/", "revoke_tokens", "1.5"),
        ("/admin/django_jobs/queue/", "pause_queues", "a\x00b"),
    ],
)
def test_the_other_lists_refuse_a_selection_that_names_no_row(superuser, url, action, selected):
    response = superuser.post(url, {"action": action, "_selected_action": [selected]})
    assert response.status_code == 400


def test_deleting_a_selection_with_an_unfinished_job_says_how_many_were_deleted(superuser):
    done = JobFactory.create_batch(2, finished=True)
    pending = JobFactory()
    response = superuser.post(
        CHANGELIST,
        {"action": "delete_selected", "_selected_action": [j.pk for j in [*done, pending]],
         "post": "yes"},
        follow=True,
    )  # fmt: skip
    assert list(Job.objects.values_list("pk", flat=True)) == [pending.pk]  # kept, as documented
    said = [str(m) for m in response.context["messages"]]
    logged = set(LogEntry.objects.values_list("object_id", flat=True))
    assert "Successfully deleted 2 jobs." in said, said
    assert "1 unfinished job kept: only finished jobs are deleted." in " ".join(said)
    assert str(pending.pk) not in logged, "the admin's history says the kept job was deleted"
