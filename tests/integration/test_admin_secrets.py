"""No admin page shows a job's secrets, to anyone: every URL the admin registers for the app is
walked, as view-only staff and as a superuser, for a job whose arguments, result, error and
traceback carry them.

The URLs are read from the admin itself, so a page added later is walked without a change here.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlencode

import pytest
from django.apps import apps
from django.contrib import admin
from django.contrib.auth.models import Permission
from django.contrib.contenttypes.models import ContentType
from django.db import models
from django.test import Client
from django.urls import URLPattern, reverse

from django_jobs.models import (
    ApiToken,
    Attempt,
    Dashboard,
    Dependency,
    Job,
    Queue,
    Schedule,
    Step,
    Worker,
)
from django_jobs.tokens import auth
from tests.factories import AttemptFactory, JobFactory, UserFactory, WorkerFactory
from tests.integration.helpers import logged_in

pytestmark = pytest.mark.django_db

# What of each secret must never show: enough of it that a half-masked value shows too.
SECRETS = ["hunter2", "abcdef123456", "tok-zzz", "pw-secret", "dXNlcjpwdy1zZWNyZXQ"]
DSN = "postgres://user:pw-secret@host/db"
PAYLOAD = {
    "password": "hunter2-secret",
    "api_key": "sk-live-abcdef123456",
    "nested": {"token": "tok-zzz"},
    "dsn": DSN,
}
ERROR = (
    f"RuntimeError: login failed password=hunter2-secret on {DSN} (Authorization: Bearer tok-zzz)"
)
# Each form sanitize.mask_text claims to catch: key=value, key: value, "key": "value",
# key='value', credentials in a URL, bearer tokens; and an Authorization header in each spelling.
TRACEBACK = f"""Traceback (most recent call last):
  File "/app/reports/jobs.py", line 12, in build_report
    client = connect("{DSN}", password="hunter2-secret")
  File "/app/reports/client.py", line 40, in connect
    session.headers["Authorization"] = "Bearer tok-zzz"
  File "/app/reports/client.py", line 44, in connect
    login(api_key='sk-live-abcdef123456', headers={{"Authorization": "Basic dXNlcjpwdy1zZWNyZXQ="}})
  File "/app/reports/client.py", line 51, in login
    raise RuntimeError(f"login failed password={{password}}: {{response.headers}}")
RuntimeError: login failed password=hunter2-secret: {{'api_key': 'sk-live-abcdef123456',
  'nested': {{'token': 'tok-zzz'}}}}
Request: GET /v1/me HTTP/1.1
Authorization: Basic dXNlcjpwdy1zZWNyZXQ=
Authorization: Bearer tok-zzz
"""


@pytest.fixture
def secret_job() -> dict[type[models.Model], Any]:
    """A failed job, with a failed attempt, a recorded step and cursors, a dependency, a child and
    its worker, all carrying secrets where a job can. Returns one row of each of the app's
    models, by model."""
    worker = WorkerFactory()
    job = JobFactory(
        task="tests.fail",
        state="error",
        attempt=1,
        max_attempts=1,
        worker_id=worker.id,
        started_at=worker.started_at,
        finished_at=worker.started_at,
        unique_key="report:42",
        args=[PAYLOAD, "--password=hunter2-secret", DSN],
        kwargs=PAYLOAD,
        result={"partial": PAYLOAD, "log": f"connected to {DSN} with token=tok-zzz"},
        error=ERROR,
    )
    attempt = AttemptFactory(
        job=job,
        number=1,
        worker_id=worker.id,
        outcome="error",
        finished_at=worker.started_at,
        error=ERROR,
        traceback=TRACEBACK,
    )
    Step.objects.create(job=job, name=f"login to {DSN}", attempt=1, result=PAYLOAD)
    job.cursors = {
        "login": {"value": PAYLOAD, "attempt": 1, "saved_at": "2026-01-01T00:00:00+00:00"},
        "password": {"value": "hunter2-secret", "attempt": 1, "saved_at": "not a time"},
        f"after {DSN}": {"value": [DSN], "attempt": 1},
    }
    job.save(update_fields=["cursors"])
    before = JobFactory(finished=True, kwargs=PAYLOAD, result=PAYLOAD)
    dependency = Dependency.objects.create(job=job, depends_on=before)
    JobFactory(parent=job, kwargs=PAYLOAD, error=ERROR)
    schedule = Schedule.objects.create(
        name="password-rotation",
        task="tests.fail",
        cron="@daily",
        args=[PAYLOAD, "--password=hunter2-secret", DSN],
        kwargs=PAYLOAD,
        last_run_at=worker.started_at,
        last_job_id=job.pk,
        last_outcome=f"not enqueued: {ERROR}"[:200],
    )
    return {
        Job: job,
        Schedule: schedule,
        Dashboard: Dashboard.objects.get(pk=job.pk),
        Attempt: attempt,
        Dependency: dependency,
        Worker: worker,
        Queue: Queue.objects.create(name=job.queue, paused=True, paused_by="ops"),
        ApiToken: auth.create("ops-fleet", [job.queue])[0],
    }


@pytest.fixture
def client_options() -> dict[str, Any]:
    """The clients answer a server error with a 500 page, for the walk to report its URL."""
    return {"raise_request_exception": False}


@pytest.fixture
def viewer(client_options: dict[str, Any]) -> Client:
    """Staff with the view permissions of every model of the app, and nothing else."""
    user = UserFactory(username="viewer")
    user.user_permissions.set(
        Permission.objects.filter(
            content_type__app_label="django_jobs", codename__startswith="view_"
        )
    )
    return logged_in(user, **client_options)


PARAMETER = re.compile(r"<(?:\w+:)?(\w+)>|\(\?P<(\w+)>[^)]*\)")


def fill(route: str, values: dict[str, Any]) -> str:
    """A URL pattern's route (``<path:object_id>/change/``, or a regex) with its parameters
    filled in."""
    filled = PARAMETER.sub(lambda m: str(values[m[1] or m[2]]), route)
    return filled.removeprefix("^").removesuffix("$")


def registered_models() -> list[type[models.Model]]:
    app = apps.get_app_config("django_jobs")
    return [model for model in app.get_models() if admin.site.is_registered(model)]


def admin_urls(rows: dict[type[models.Model], Any]) -> list[str]:
    """Every URL the admin serves for the app's models, with the ids of ``rows`` filled in: each
    model admin's own URLs, and the site's pages that take an app, a content type or an object
    (the app's index, "view on site", the catch-all)."""
    root = reverse("admin:index")
    urls = []
    for model in registered_models():
        assert model in rows, f"the walk needs a row of {model.__name__}: add one to secret_job"
        row = rows[model]
        values = {
            "object_id": row.pk,
            "pk": row.pk,
            "app_label": model._meta.app_label,
            "content_type_id": ContentType.objects.get_for_model(model, False).pk,
            "url": f"{model._meta.app_label}/{model._meta.model_name}/{row.pk}/change",
            "queue": rows[Job].queue,
            "action": "resume",
        }
        prefix = f"{root}{model._meta.app_label}/{model._meta.model_name}/"
        for pattern in admin.site.get_model_admin(model).get_urls():
            urls.append(prefix + fill(str(pattern.pattern), values))
        for pattern in admin.site.get_urls():
            if isinstance(pattern, URLPattern):  # the others are the model admins' includes
                urls.append(root + fill(str(pattern.pattern), values))
    return list(dict.fromkeys(urls))


def search_urls(rows: dict[type[models.Model], Any]) -> list[str]:
    """The app's lists, searched and filtered, and the autocomplete that searches jobs from each
    of the app's foreign keys."""
    job = rows[Job]
    terms = ["", str(job.pk), f"#{job.pk}", "tests.", "password", job.worker_id, job.unique_key]
    urls = []
    for model in registered_models():
        changelist = reverse(f"admin:django_jobs_{model._meta.model_name}_changelist")
        urls += [f"{changelist}?{urlencode({'q': term})}" for term in terms]
        urls += [
            f"{changelist}?state=error",
            f"{changelist}?parent={job.pk}",
            f"{changelist}?task=tests.fail&state=error&finished=24h",
        ]
    for model in apps.get_app_config("django_jobs").get_models():
        for field in model._meta.get_fields():
            if (
                field.many_to_one
                and field.concrete
                and admin.site.is_registered(field.related_model)
            ):
                for term in terms:
                    query = {
                        "app_label": "django_jobs",
                        "model_name": model._meta.model_name,
                        "field_name": field.name,
                        "term": term,
                    }
                    urls.append(f"{reverse('admin:autocomplete')}?{urlencode(query)}")
    return urls


def leaks(response: Any) -> list[str]:
    body = response.content.decode(errors="replace")
    return [secret for secret in SECRETS if secret in body]


@pytest.mark.parametrize("who", ["view-only staff", "superuser"])
def test_no_admin_page_shows_a_secret(request, secret_job, who) -> None:
    client = request.getfixturevalue("viewer" if who == "view-only staff" else "superuser")
    job = secret_job[Job]
    urls = admin_urls(secret_job) + search_urls(secret_job)
    assert reverse("admin:django_jobs_job_change", args=[job.pk]) in urls
    problems = []
    for url in urls:
        response = client.get(url, follow=True)
        if response.status_code >= 500 or leaks(response):
            problems.append((url, response.status_code, leaks(response)))
    # The delete confirmation of the list's action.
    changelist = reverse("admin:django_jobs_job_changelist")
    response = client.post(
        changelist, {"action": "delete_selected", "_selected_action": [job.pk]}, follow=True
    )
    if response.status_code >= 500 or leaks(response):
        problems.append(
            (f"POST {changelist} delete_selected", response.status_code, leaks(response))
        )
    assert problems == [], "\n".join(f"{url} {status} {found}" for url, status, found in problems)

    # The walk saw the pages that show the job's payload, its traceback, steps and cursors.
    page = client.get(reverse("admin:django_jobs_job_change", args=[job.pk]))
    assert page.status_code == 200
    content = page.content.decode()
    assert "********" in content and "dj-json" in content
    assert 'class="dj-traceback"' in content
    assert 'id="dj-steps"' in content and 'id="dj-cursors"' in content


def test_the_dashboard_has_no_page_per_job(secret_job, viewer, superuser) -> None:
    job = secret_job[Job]
    for client in (viewer, superuser):
        assert client.get(reverse("admin:django_jobs_dashboard_changelist")).status_code == 200
        for page in ("", "change/", "history/", "delete/"):
            response = client.get(f"/admin/django_jobs/dashboard/{job.pk}/{page}")
            assert response.status_code == 404, page
        assert client.get("/admin/django_jobs/dashboard/add/").status_code == 404


@pytest.mark.parametrize(
    "lookup",
    [
        "kwargs__password__startswith=hunter",
        "kwargs__nested__token=tok-zzz",
        "args__0__api_key__contains=sk-live",
        "result__partial__password__startswith=h",
        "error__contains=hunter2",
        "parent__kwargs__password__startswith=hunter",
        "attempts__traceback__contains=hunter2",
    ],
)
def test_the_list_cannot_be_filtered_on_masked_values(
    secret_job, viewer, superuser, lookup
) -> None:
    """A filter on a masked value would reveal it a letter at a time."""
    for client in (viewer, superuser):
        response = client.get(f"{reverse('admin:django_jobs_job_changelist')}?{lookup}")
        assert response.status_code == 400, lookup
