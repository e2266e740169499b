"""The admin in a real browser: headless Chromium (Debian's package) driven by Playwright.

With ``DJANGO_JOBS_SCREENSHOTS=1``, screenshots land in ``artifacts/screenshots/``; a plain run
writes none.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from django_jobs.models import Job, Queue, Schedule, Step
from tests.factories import AttemptFactory, JobFactory, UserFactory
from tests.system.helpers import PASSWORD, SHOTS, screenshot

pytest.importorskip("playwright.sync_api")
# Without chromium, tests/conftest.py skips every test that uses the browser fixture.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser]


def log_in(page, live_server, username: str = "operator") -> None:
    page.goto(f"{live_server.url}/admin/login/?next=/admin/")
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_selector("#site-name")


def make_jobs() -> list[Job]:
    created = JobFactory().created_at
    failed = []
    for i in range(3):
        job = JobFactory(
            task="tests.fail",
            state="error",
            attempt=1,
            max_attempts=1,
            finished_at=created,
            error=f"ValueError: feed {i} is broken",
            kwargs={"feed": i, "api_key": "sk-live-123"},
        )
        AttemptFactory(
            job=job,
            number=1,
            outcome="error",
            finished_at=created,
            error=job.error,
            traceback=f'Traceback (most recent call last):\n  File "jobs.py", line 9\n'
            f"ValueError: feed {i} is broken",
        )
        failed.append(job)
    JobFactory.create_batch(4, finished=True, task="tests.echo")
    JobFactory(claimed=True, task="tests.sleep", worker_id="jobs-worker-6d9c7f8b5d-2xkqp:1:a1b2c3")
    return failed


def test_an_operator_filters_errors_retries_them_and_inspects_a_job(
    browser, live_server, operator
) -> None:
    failed = make_jobs()
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    log_in(page, live_server)

    page.goto(f"{live_server.url}/admin/django_jobs/job/")
    page.click("#changelist-filter >> text=Error")
    page.wait_for_url("**/?state=error")
    assert page.locator("#result_list tbody tr").count() == 3
    screenshot(page, SHOTS / "job-list-errors.png", full_page=True)

    page.check("#action-toggle")
    page.select_option("select[name=action]", "retry_selected")
    page.click("button[name=index]")
    message = page.locator(".messagelist li").first.inner_text()
    assert message == "3 jobs requeued"
    assert set(
        Job.objects.filter(pk__in=[j.pk for j in failed]).values_list("state", flat=True)
    ) == {"pending"}
    page.goto(f"{live_server.url}/admin/django_jobs/job/?state=pending")
    assert page.locator("#result_list .dj-pending").count() >= 3
    screenshot(page, SHOTS / "job-list-after-retry.png", full_page=True)

    page.click(f"#result_list a:text-is('{failed[0].pk}')")
    page.wait_for_selector(".dj-timeline")
    content = page.content()
    assert "sk-live-123" not in content and "********" in content
    page.click("summary:text('traceback')")
    assert page.locator(".dj-traceback pre").first.is_visible()
    screenshot(page, SHOTS / "job-page.png", full_page=True)

    page.goto(f"{live_server.url}/admin/")
    page.click("text=Dashboard")
    page.wait_for_selector("#dj-queues")
    assert "sleep" in page.locator("#dj-running").inner_text()
    screenshot(page, SHOTS / "dashboard.png", full_page=True)
    context.close()


def test_the_list_reads_well_in_dark_mode_and_on_a_narrow_window(
    browser, live_server, operator
) -> None:
    make_jobs()
    for name, options in [
        ("job-list-dark.png", {"color_scheme": "dark", "viewport": {"width": 1400, "height": 800}}),
        ("job-list-narrow.png", {"viewport": {"width": 420, "height": 900}}),
    ]:
        context = browser.new_context(**options)
        page = context.new_page()
        log_in(page, live_server)
        page.goto(f"{live_server.url}/admin/django_jobs/job/")
        assert page.locator("#result_list tbody tr").count() == 9
        # No part of the page is wider than the window, except the table's own scroller.
        overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        assert overflow <= 0, overflow
        screenshot(page, SHOTS / name, full_page=True)
        context.close()


def test_an_operator_adds_pauses_and_runs_a_schedule(browser, live_server, operator) -> None:
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    log_in(page, live_server)

    page.goto(f"{live_server.url}/admin/django_jobs/schedule/add/")
    page.fill("#id_name", "hourly-echo")
    page.select_option("#id_task", "tests.echo")
    page.fill("#id_cron", "61 * * * *")
    page.fill("#id_kwargs", '{"feed": "a", "api_key": "sk-live-123"}')
    page.click("input[name=_save]")
    page.wait_for_selector(".errornote")
    assert "invalid cron expression" in page.locator(".errorlist").first.inner_text()
    assert not Schedule.objects.exists()
    screenshot(page, SHOTS / "schedule-form-error.png", full_page=True)

    page.fill("#id_cron", "5 * * * *")
    page.click("input[name=_save]")
    page.wait_for_selector(".messagelist .success")
    schedule = Schedule.objects.get(name="hourly-echo")
    assert schedule.next_run_at is not None and schedule.kwargs["api_key"] == "sk-live-123"
    row = page.locator("#result_list tbody tr").first
    assert "tests.echo" in row.inner_text() and "5 * * * *" in row.inner_text()
    screenshot(page, SHOTS / "schedule-list.png", full_page=True)

    page.click("#result_list a:text-is('hourly-echo')")
    assert "sk-live-123" not in page.content()
    page.click(".object-tools button:text-is('Pause')")
    assert "paused: hourly-echo" in page.locator(".messagelist li").first.inner_text()
    assert page.locator(".object-tools button:text-is('Resume')").count() == 1
    assert "paused by operator" in page.locator(".fieldBox.field-paused_text").inner_text()

    page.click(".object-tools button:text-is('Run now')")
    link = page.locator(".messagelist li a").first
    job = Job.objects.get(task="tests.echo")
    assert link.inner_text() == f"job #{job.pk}"
    screenshot(page, SHOTS / "schedule-page.png", full_page=True)
    link.click()
    page.wait_for_selector(".dj-timeline")
    assert page.url.endswith(f"/admin/django_jobs/job/{job.pk}/change/")
    context.close()


def test_without_the_pause_permission_there_is_no_pause_button(browser, live_server) -> None:
    schedule = Schedule.objects.create(name="nightly", task="tests.echo", cron="0 3 * * *")
    codenames = ["view_schedule", "run_schedule", "view_job"]
    UserFactory(username="viewer", password=PASSWORD, permissions=codenames)
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    log_in(page, live_server, "viewer")

    page.goto(f"{live_server.url}/admin/django_jobs/schedule/")
    actions = page.locator("select[name=action] option").all_inner_texts()
    assert "Run selected schedules now" in actions
    assert not [a for a in actions if "ause" in a or "esume" in a]
    page.goto(f"{live_server.url}/admin/django_jobs/schedule/{schedule.pk}/change/")
    assert page.locator(".object-tools button:text-is('Run now')").count() == 1
    assert page.locator(".object-tools button:text-is('Pause')").count() == 0
    screenshot(page, SHOTS / "schedule-page-no-pause.png", full_page=True)

    # Posting the button's URL anyway, with a valid CSRF token, is refused.
    token = next(c["value"] for c in context.cookies() if c["name"] == "csrftoken")
    response = page.request.post(
        f"{live_server.url}/admin/django_jobs/schedule/{schedule.pk}/pause/",
        headers={"X-CSRFToken": token, "Referer": page.url},
        max_redirects=0,
    )
    assert response.status == 403 and "CSRF" not in response.text()
    schedule.refresh_from_db()
    assert not schedule.paused
    context.close()


def test_a_running_jobs_progress_bar_and_live_log_render(browser, live_server, operator) -> None:
    make_jobs()
    created = Job.objects.order_by("id").first().created_at
    for done, total, message in [(640, 1000, "row 640"), (45, 60, "page 45"), (12, None, "")]:
        job = JobFactory(
            claimed=True,
            task="reports.build_report",
            worker_id="jobs-worker-6d9c7f8b5d-2xkqp:1:a1b2c3",
            started_at=created,
            progress_done=done,
            progress_total=total,
            progress_message=message,
            progress_updated_at=created + timedelta(seconds=40),
        )
        Job.objects.filter(pk=job.pk).update(progress_attempt=job.attempt)
        AttemptFactory(job=job, number=job.attempt, log="rendering page 44\nrendering page 45\n")
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    log_in(page, live_server)
    page.goto(f"{live_server.url}/admin/django_jobs/job/?state=running")
    assert page.locator("#result_list .dj-progress").count() == 2
    assert "64%" in page.locator("#result_list").inner_text()
    screenshot(page, SHOTS / "progress.png", full_page=True)

    page.goto(f"{live_server.url}/admin/django_jobs/job/{job.pk}/change/")
    assert "12 done" in page.content()
    assert page.locator(".dj-log pre").first.is_visible()
    screenshot(page, SHOTS / "progress-job-page.png", full_page=True)
    context.close()


def test_an_operator_pauses_and_resumes_a_queue_from_the_dashboard(
    browser, live_server, operator
) -> None:
    JobFactory(queue="imports")
    JobFactory(queue="default")
    context = browser.new_context(viewport={"width": 1600, "height": 900})
    page = context.new_page()
    log_in(page, live_server)
    page.goto(f"{live_server.url}/admin/django_jobs/dashboard/")
    row = page.locator("#dj-queues tbody tr:has(td a:text-is('imports'))")
    assert "open" in row.inner_text()
    row.locator("input[name=reason]").fill("nightly migration")
    row.locator("button:text-is('Pause')").click()
    page.wait_for_selector(".messagelist .success")
    assert "Queue imports paused." in page.locator(".messagelist li").first.inner_text()
    row = page.locator("#dj-queues tbody tr:has(td a:text-is('imports'))")
    assert "paused" in row.inner_text() and "by operator" in row.inner_text()
    assert "nightly migration" in row.inner_text()
    assert Queue.objects.get(name="imports").paused
    screenshot(page, SHOTS / "dashboard-paused-queue.png", full_page=True)
    row.locator("button:text-is('Resume')").click()
    page.wait_for_selector(".messagelist .success")
    assert not Queue.objects.get(name="imports").paused
    context.close()


def test_without_the_queue_permission_the_dashboard_has_no_pause_button(
    browser, live_server
) -> None:
    JobFactory(queue="imports")
    UserFactory(username="viewer", password=PASSWORD, permissions=["view_job"])
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    log_in(page, live_server, "viewer")
    page.goto(f"{live_server.url}/admin/django_jobs/dashboard/")
    page.wait_for_selector("#dj-queues")
    assert page.locator("#dj-queues button").count() == 0
    token = next(c["value"] for c in context.cookies() if c["name"] == "csrftoken")
    response = page.request.post(
        f"{live_server.url}/admin/django_jobs/dashboard/queues/imports/pause/",
        headers={"X-CSRFToken": token, "Referer": page.url},
        max_redirects=0,
    )
    assert response.status == 403 and "CSRF" not in response.text()
    assert not Queue.objects.filter(paused=True).exists()
    context.close()


def test_a_long_jobs_steps_and_cursors_fit_the_page_and_retry_from_the_start(
    browser, live_server, operator
) -> None:
    created = JobFactory().created_at
    job = JobFactory(
        task="imports.load_feed",
        state="error",
        attempt=2,
        max_attempts=2,
        started_at=created,
        finished_at=created,
        worker_id="jobs-worker-6d9c7f8b5d-2xkqp:1:a1b2c3",
        error="ValueError: feed 3 is broken",
    )
    Step.objects.bulk_create(
        Step(
            job=job,
            # Long names, some without a space to wrap at, one as long as a name may be.
            name="n" * 200
            if i == 249
            else f"download https://feeds.example.com/{i}/" + "part" * (i % 5 * 6),
            attempt=1 + i % 2,
            result=i,
            result_bytes=40 * i,
            duration=i / 10,
        )
        for i in range(250)
    )
    saved_at = created.isoformat()
    job.cursors = {
        "offset": {"value": 12_500, "attempt": 2, "saved_at": saved_at},
        "seen": {"value": {"ids": list(range(400)), "api_key": "sk-live-123"}, "attempt": 1},
        "marker": {"value": "x" * 600, "attempt": 2, "saved_at": saved_at},
    }
    job.save(update_fields=["cursors"])
    url = f"{live_server.url}/admin/django_jobs/job/{job.pk}/change/"
    for name, options in [
        (
            "job-page-steps-dark.png",
            {"color_scheme": "dark", "viewport": {"width": 1400, "height": 900}},
        ),
        ("job-page-steps-narrow.png", {"viewport": {"width": 420, "height": 900}}),
    ]:
        context = browser.new_context(**options)
        page = context.new_page()
        log_in(page, live_server)
        page.goto(url)
        assert page.locator("#dj-steps tbody tr").count() == 200
        assert page.locator("#dj-cursors tbody tr").count() == 3
        assert "The last 200 of 250 steps" in page.locator("#dj-steps-left-out").inner_text()
        assert "sk-live-123" not in page.content()
        # No part of the page is wider than the window, except the tables' own scrollers.
        overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        assert overflow <= 0, overflow
        screenshot(page, SHOTS / name, full_page=True)
        context.close()

    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    log_in(page, live_server)
    page.goto(url)
    assert (
        page.locator(
            ".object-tools button:text-is('Retry (resume from steps and cursors)')"
        ).count()
        == 1
    )
    # It asks first: dismissed, nothing happens; accepted, the job is requeued.
    page.once("dialog", lambda dialog: dialog.dismiss())
    page.click(".object-tools button:text-is('Retry from the start')")
    assert Step.objects.filter(job=job).exists()
    page.once("dialog", lambda dialog: dialog.accept())
    page.click(".object-tools button:text-is('Retry from the start')")
    assert page.locator(".messagelist li").first.inner_text() == "1 job requeued from the start"
    assert page.locator("#dj-checkpoint").count() == 0
    assert not Step.objects.filter(job=job).exists()
    assert Job.objects.get(pk=job.pk).cursors is None
    context.close()


def test_the_dashboards_task_statistics_come_from_the_rollups_and_fit_the_page(
    browser, live_server, operator
) -> None:
    from django.utils import timezone

    from django_jobs import rollups

    now = timezone.now()
    for day in range(6):
        for i in range(10 + day):
            at = now - timedelta(days=day, hours=2, minutes=i)
            failed = i % 5 == 0
            job = JobFactory(
                finished=True, task="reports.build", state="error" if failed else "done",
                started_at=at - timedelta(seconds=4 + i), finished_at=at,
            )  # fmt: skip
            AttemptFactory(
                job=job, outcome="error" if failed else "done",
                started_at=at - timedelta(seconds=4 + i), finished_at=at,
            )  # fmt: skip
    rollups.roll_up()
    Job.objects.all().delete()  # as a prune would: the statistics stay
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    log_in(page, live_server)
    page.goto(f"{live_server.url}/admin/django_jobs/dashboard/")
    row = page.locator("#dj-tasks tbody tr:has(td a:text-is('reports.build'))")
    cells = row.locator("td").all_inner_texts()
    assert cells[1] == "75"  # 10 + 11 + ... + 15 jobs
    assert cells[2] == "17"  # i = 0 and 5 on the first day, and 10 on the others
    assert cells[3] == f"{17 / 75:.1%}"
    assert cells[7].endswith("s") and cells[8].endswith("s")  # p50 and p95
    assert row.locator("svg.dj-trend rect").count() == 2 * 7
    overflow = page.evaluate(
        """() => [...document.querySelectorAll('#dj-tasks, #dj-tasks th, #dj-tasks td')]
              .filter(e => e.scrollWidth > e.clientWidth + 1 &&
                           getComputedStyle(e).overflow !== 'visible')
              .map(e => e.outerHTML.slice(0, 80))"""
    )
    assert overflow == []
    table = page.locator("#dj-tasks").bounding_box()
    assert table is not None and table["x"] + table["width"] <= 1280
    screenshot(page.locator("#dj-tasks"), SHOTS / "dashboard-task-statistics.png")
    context.close()
