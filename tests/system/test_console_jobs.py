"""The console's job list and job page in a real browser, at a laptop's and a desktop's width:
what an operator reads in them, measured in the page, and the screenshots docs/admin.md shows
(``console-list``, ``console-job-failed``, ``console-job-running``, ``console-job-scheduled``).
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from django_jobs.models import Job
from tests.factories import AttemptFactory, JobFactory
from tests.system.helpers import WIDTHS, open_page, shoot

pytest.importorskip("playwright.sync_api")
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser]

TRACEBACK = """Traceback (most recent call last):
  File "/srv/app/venv/lib/python3.12/site-packages/django_jobs/worker/executor.py", line 80, in run
    result = call(job)
             ^^^^^^^^^
  File "/srv/app/venv/lib/python3.12/site-packages/django_jobs/worker/executor.py", line 41, in call
    return function(*args, **kwargs)
  File "/srv/app/venv/lib/python3.12/site-packages/django_jobs/context.py", line 19, in wrapped
    return run()
  File "/srv/app/imports/tasks.py", line 12, in load_feed
    rows = fetch(feed_url, token=token)
  File "/srv/app/imports/feeds.py", line 88, in fetch
    raise ValueError(f"feed {feed_url} answered 502 after 3 tries")
ValueError: feed https://feeds.example.com/partners/acme/orders.xml answered 502 after 3 tries"""


def fill() -> dict[str, Job]:
    """A list with every kind of job an operator meets: failed with a long error, running with
    progress and a long log, scheduled, pending, done, and a task name too long for its cell."""
    now = timezone.now()
    for i in range(6):
        JobFactory(finished=True, task="reports.build_daily_summary", kwargs={"report_id": i},
                   started_at=now - timedelta(minutes=30 - i, seconds=12),
                   finished_at=now - timedelta(minutes=30 - i))  # fmt: skip
    failed = JobFactory(
        task="imports.partners.acme.load_feed_and_reconcile_orders_with_the_ledger",
        queue="imports", priority=5, state="error", attempt=3, max_attempts=3,
        started_at=now - timedelta(minutes=4), finished_at=now - timedelta(minutes=3, seconds=58),
        worker_id="jobs-worker-6d9c7f8b5d-2xkqp:1:a1b2c3d4e5f6",
        error="ValueError: feed https://feeds.example.com/partners/acme/orders.xml answered 502 "
        "after 3 tries (token=sk-live-123, upstream said: service unavailable, retry later)",
        kwargs={"feed": "acme", "api_key": "sk-live-123", "batch": 42},
    )  # fmt: skip
    for number in (1, 2, 3):
        AttemptFactory(job=failed, number=number, outcome="error", error=failed.error,
                       started_at=now - timedelta(minutes=10 - number),
                       finished_at=now - timedelta(minutes=10 - number, seconds=-2),
                       traceback=TRACEBACK)  # fmt: skip
    JobFactory.create_batch(2, parent=failed, task="imports.load_partner_page", finished=True)
    running = JobFactory(
        claimed=True, task="reports.build_report", queue="reports",
        started_at=now - timedelta(minutes=2, seconds=5),
        worker_id="jobs-worker-6d9c7f8b5d-2xkqp:1:a1b2c3d4e5f6",
        progress_done=640, progress_total=1000, progress_message="page 640",
        progress_updated_at=now - timedelta(seconds=3),
    )  # fmt: skip
    Job.objects.filter(pk=running.pk).update(progress_attempt=running.attempt)
    AttemptFactory(
        job=running, number=1, outcome="running", started_at=running.started_at,
        worker_id=running.worker_id,
        log="\n".join(f"rendering page {i} of 1000: 48 rows, 2 charts" for i in range(1, 341)),
    )  # fmt: skip
    scheduled = JobFactory(
        task="billing.send_invoices", run_after=now + timedelta(hours=3), kwargs={"month": "11"}
    )
    pending = JobFactory(task="billing.charge_card", kwargs={"invoice": 1017})
    return {"failed": failed, "running": running, "scheduled": scheduled, "pending": pending}


@pytest.mark.parametrize("width", WIDTHS)
def test_the_job_list_shows_every_state_fits_and_finds_an_argument(
    browser,
    live_server,
    operator,
    width,
) -> None:
    jobs = fill()
    page = open_page(browser, live_server, width)
    page.goto(f"{live_server.url}/admin/django_jobs/job/")
    row = page.locator(f"#result_list tr:has(a:text-is('{jobs['scheduled'].pk}'))")
    assert row.locator(".dj-badge.dj-scheduled").inner_text() == "scheduled"
    assert row.locator(".dj-run-after time").count() == 1
    failed = page.locator(f"#result_list tr:has(a:text-is('{jobs['failed'].pk}'))")
    error = failed.locator(".dj-error-head")
    assert error.inner_text().startswith("ValueError: feed https://feeds.example.com/")
    assert error.inner_text().endswith("…") and "sk-live-123" not in page.content()
    assert "retry later" in (error.get_attribute("title") or "")
    created = failed.locator(".dj-when time").first
    title = created.get_attribute("title") or ""
    assert title[:19].replace("T", " ") == created.inner_text() and title[-6] in "+-"
    tabs = dict(
        zip(
            page.locator("#dj-state-tabs a").evaluate_all("es => es.map(e => e.dataset.state)"),
            page.locator("#dj-state-tabs .dj-count").all_inner_texts(),
            strict=True,
        )
    )
    assert tabs[""] == "12" and tabs["done"] == "8" and tabs["scheduled"] == "1"
    assert tabs["pending"] == "1" and tabs["running"] == "1" and tabs["error"] == "1"
    shoot(page, "list", width)

    page.click("#dj-state-tabs a[data-state=scheduled]")
    page.wait_for_url("**/?state=scheduled")
    assert page.locator("#result_list tbody tr").count() == 1
    assert page.locator("#dj-state-tabs a.selected").get_attribute("data-state") == "scheduled"

    page.goto(f"{live_server.url}/admin/django_jobs/job/")
    page.fill("#searchbar", "invoice=1017")
    page.press("#searchbar", "Enter")
    page.wait_for_url("**q=invoice*")
    ids = page.locator(
        "#result_list tbody th a, #result_list tbody td.field-id a"
    ).all_inner_texts()
    assert page.locator("#result_list tbody tr").count() == 1
    assert str(jobs["pending"].pk) in ids
    page.context.close()


@pytest.mark.parametrize("width", WIDTHS)
def test_a_failed_jobs_page_opens_on_its_error_and_traceback(
    browser,
    live_server,
    operator,
    width,
) -> None:
    job = fill()["failed"]
    page = open_page(browser, live_server, width)
    page.goto(f"{live_server.url}/admin/django_jobs/job/{job.pk}/change/")
    summary = page.locator("#dj-summary")
    assert "3 of 3" in summary.inner_text() and "2 children" in summary.inner_text()
    assert page.locator("#dj-traceback").evaluate("e => e.open") is True
    assert page.locator("#dj-traceback .dj-tb > pre").first.is_visible()
    own = page.locator("#dj-traceback .dj-own-frames")
    assert own.locator("summary").inner_text() == "3 django-jobs frames"
    assert own.evaluate("e => e.open") is False
    assert "imports/feeds.py" in page.locator("#dj-traceback").inner_text()
    page.click("#dj-summary a[href='#dj-traceback']")
    assert page.url.endswith("#dj-traceback")
    cancel = page.locator(".fieldBox.field-cancel_requested_text .readonly")
    assert cancel.inner_text() == "no" and cancel.locator(".dj-muted").count() == 1
    assert "sk-live-123" not in page.content()
    shoot(page, "job-failed", width)
    page.context.close()


@pytest.mark.parametrize("width", WIDTHS)
def test_a_running_jobs_live_log_is_wide_and_follows_its_newest_line(
    browser,
    live_server,
    operator,
    width,
) -> None:
    job = fill()["running"]
    page = open_page(browser, live_server, width)
    page.goto(f"{live_server.url}/admin/django_jobs/job/{job.pk}/change/")
    log = page.locator("#dj-live-log pre")
    page.wait_for_function(
        "() => { const p = document.querySelector('#dj-live-log pre');"
        " return p.scrollTop > 0 && p.scrollTop + p.clientHeight >= p.scrollHeight - 1; }"
    )
    assert log.inner_text().endswith("rendering page 340 of 1000: 48 rows, 2 charts")
    content = page.locator("#content-main").bounding_box()
    box = log.bounding_box()
    assert content is not None and box is not None and box["width"] >= 0.9 * content["width"]
    assert "last 200 of 340 lines" in page.locator("#dj-live-log").inner_text()
    # 640 of 1,000: the progress says 64%, and its one bar is filled to 64% of its width.
    progress = page.locator(".field-progress_text")
    assert "64%" in progress.inner_text()
    bar = progress.locator(".dj-progress-bar")
    assert bar.count() == 1
    filled = bar.locator("span").bounding_box()
    assert filled is not None
    assert filled["width"] / bar.evaluate("b => b.clientWidth") == pytest.approx(0.64, abs=0.01)
    shoot(page, "job-running", width)
    page.click("#dj-log-more")
    page.wait_for_url("**log_lines=400*")
    assert "last 340 of 340 lines" in page.locator("#dj-live-log").inner_text()
    assert page.locator("#dj-log-more").count() == 0
    page.context.close()


@pytest.mark.parametrize("width", WIDTHS)
def test_a_scheduled_jobs_page_says_when_it_runs(
    browser,
    live_server,
    operator,
    width,
) -> None:
    job = fill()["scheduled"]
    page = open_page(browser, live_server, width)
    page.goto(f"{live_server.url}/admin/django_jobs/job/{job.pk}/change/")
    summary = page.locator("#dj-summary")
    assert summary.locator(".dj-badge.dj-scheduled").count() == 1
    run_after = summary.locator(".dj-run-after time")
    assert run_after.get_attribute("datetime") == timezone.localtime(job.run_after).isoformat()
    assert "not started yet" in summary.inner_text()
    assert page.locator("#dj-traceback").count() == 0
    shoot(page, "job-scheduled", width)
    page.context.close()


def test_the_lists_auto_refresh_is_remembered_and_waits_while_rows_are_selected(
    browser, live_server, operator
) -> None:
    fill()
    page = open_page(browser, live_server, WIDTHS[0])
    page.goto(f"{live_server.url}/admin/django_jobs/job/")
    assert page.locator("#dj-refresh").input_value() == "0"  # off by default
    page.select_option("#dj-refresh", "5")
    assert page.evaluate("localStorage.getItem('django-jobs.refresh')") == "5"
    page.reload()
    assert page.locator("#dj-refresh").input_value() == "5"
    # With a row selected for an action, the page is left alone.
    page.evaluate("window.djMarker = 1")
    page.locator("#result_list input.action-select").first.check()
    page.wait_for_timeout(6500)
    assert page.evaluate("window.djMarker") == 1
    page.locator("#result_list input.action-select").first.uncheck()
    with page.expect_navigation(timeout=12_000):
        pass
    assert page.evaluate("window.djMarker") is None
    page.context.close()
