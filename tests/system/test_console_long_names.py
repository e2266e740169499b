"""The console at 1280 px with the long names real teams use: a dotted task path, a long
queue name, a pod's worker id, a long pause reason, token and schedule names. Every page loads
(200, not the login page), shows them in full, wraps them, and nothing is cut off or pushed past
the window (measured in the page)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from django_jobs.models import ApiToken, Schedule, Step
from django_jobs.models.queue_control import Queue
from tests.factories import AttemptFactory, JobFactory, WorkerFactory
from tests.system.helpers import clipped, open_page

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser]

TASK = "myproject.integrations.salesforce.tasks.synchronize_opportunity_line_items_for_account"
QUEUE = "salesforce-synchronization-high-priority"
WORKER = "jobs-worker-salesforce-synchronization-7f9c8d6b5-x2k4p:1:a1b2c3d4e5f6"
HOST = "ip-10-0-12-34.eu-west-1.compute.internal"
STEP = "fetch_opportunity_line_items_page_0015g00000XyZabAAB"
PAUSED_BY = "alice.operator@example.com"
PAUSE_REASON = "Salesforce is returning 503 for the composite API, see incident INC-4821"
TOKEN = "salesforce-sync-worker-production-eu-west-1"
SCHEDULE = "salesforce-nightly-opportunity-reconciliation"


def test_every_console_page_fits_1280_px_with_long_real_world_names(
    browser,
    live_server,
) -> None:
    User.objects.create_superuser("operator", password="correct horse battery")
    now = timezone.now()
    job = JobFactory(
        task=TASK,
        queue=QUEUE,
        state="error",
        attempt=3,
        max_attempts=3,
        priority=10,
        started_at=now - timedelta(seconds=3),
        finished_at=now,
        worker_id=WORKER,
        error="SalesforceMalformedRequest: https://acme.my.salesforce.com/services/data/v59.0"
        "/composite/sobjects/OpportunityLineItem/externalId__c answered 400",
        unique_key="salesforce:account:0015g00000XyZabAAB:opportunity-line-items",
        kwargs={"account_id": "0015g00000XyZabAAB", "since": "2024-01-01T00:00:00+00:00"},
        concurrency_key="salesforce-api-account-0015g00000XyZabAAB",
        concurrency_limit=1,
    )
    AttemptFactory(
        job=job, number=1, outcome="error", worker_id=WORKER, error=job.error, finished_at=now
    )
    Step.objects.create(
        job=job,
        name=STEP,
        attempt=1,
        result={"a": 1},
    )
    JobFactory(
        claimed=True, queue=QUEUE, task=TASK, worker_id=WORKER, progress_done=5, progress_total=10
    )
    WorkerFactory(
        id=WORKER,
        name=WORKER.rsplit(":", 2)[0],
        host=HOST,
        queues=[QUEUE, "default", "reports"],
    )
    Queue.objects.create(
        name=QUEUE,
        paused=True,
        paused_by=PAUSED_BY,
        pause_reason=PAUSE_REASON,
        paused_at=now,
        concurrency_limit=5,
    )
    ApiToken.objects.create(
        name=TOKEN,
        token_hash="h" * 64,
        prefix="djk_AbCdEfGh",
        queues=[QUEUE, "default", "reports", "imports"],
        tasks=[TASK],
        expires_at=now + timedelta(days=90),
    )
    Schedule.objects.create(
        name=SCHEDULE,
        task=TASK,
        cron="0,15,30,45 8-18 * * mon-fri",
        timezone="America/Argentina/Buenos_Aires",
        last_outcome="skipped: queue paused",
        queue=QUEUE,
    )
    page = open_page(browser, live_server, 1280)
    # Each page, and the long names it shows (in its text, wrapped or not).
    pages = {
        "list": ("/admin/django_jobs/job/", [TASK, QUEUE, WORKER]),
        "job": (f"/admin/django_jobs/job/{job.pk}/change/", [TASK, QUEUE, WORKER, STEP]),
        "dashboard": (
            "/admin/django_jobs/dashboard/",
            [TASK, QUEUE, WORKER, HOST, PAUSED_BY, PAUSE_REASON],
        ),
        "queues": ("/admin/django_jobs/queue/", [QUEUE, PAUSED_BY, PAUSE_REASON]),
        "queue": (f"/admin/django_jobs/queue/{QUEUE}/change/", [QUEUE, PAUSED_BY, PAUSE_REASON]),
        "schedules": ("/admin/django_jobs/schedule/", [SCHEDULE, TASK]),
        "schedule": (
            f"/admin/django_jobs/schedule/{Schedule.objects.get().pk}/change/",
            [SCHEDULE, TASK],
        ),
        "tokens": ("/admin/django_jobs/apitoken/", [TOKEN, TASK, QUEUE]),
        "token": (
            f"/admin/django_jobs/apitoken/{ApiToken.objects.get().pk}/change/",
            [TOKEN, TASK, QUEUE],
        ),
    }
    out = {}
    for name, (url, shown) in pages.items():
        response = page.goto(live_server.url + url)
        # The page itself: not an error page, nor the login page it would redirect to.
        assert response is not None and response.status == 200, (name, response)
        assert page.url == live_server.url + url, (name, page.url)
        text = page.inner_text("#content")
        assert [long_name for long_name in shown if long_name not in text] == [], name
        problems = clipped(page)
        if problems:
            out[name] = problems
    assert not out, "\n".join(
        f"{name}: {' '.join(p.split())[:200]}" for name, ps in out.items() for p in ps[:5]
    )
    page.context.close()
