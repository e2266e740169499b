"""The console's dashboard, queues page and API tokens in a real browser (headless Chromium
through Playwright) at the widths of :data:`tests.system.helpers.WIDTHS`: each page fits, and
its screenshot is written to docs/images/ when ``DJANGO_JOBS_SCREENSHOTS=1`` asks for it."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from django_jobs import queues, rollups
from django_jobs.models import ApiToken, Queue
from tests.factories import AttemptFactory, JobFactory, UserFactory
from tests.system.helpers import PASSWORD, WIDTHS, assert_fits, open_page, shoot

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser]


def fill() -> None:
    """Jobs in several queues, a paused one, and a week of rolled-up hours."""
    now = timezone.now()
    for hours_ago in range(1, 24 * 6, 5):
        for i in range(1 + hours_ago % 7):
            at = now - timedelta(hours=hours_ago, minutes=i)
            failed = i % 4 == 3
            job = JobFactory(
                finished=True, task="reports.build", queue="reports",
                state="error" if failed else "done",
                started_at=at - timedelta(seconds=3 + i), finished_at=at,
            )  # fmt: skip
            AttemptFactory(
                job=job, outcome="error" if failed else "done",
                started_at=at - timedelta(seconds=3 + i), finished_at=at,
            )  # fmt: skip
    rollups.roll_up()
    for minutes_ago in range(2, 50, 3):
        at = now - timedelta(minutes=minutes_ago)
        job = JobFactory(finished=True, task="emails.send", queue="emails", finished_at=at)
        AttemptFactory(
            job=job, outcome="done", started_at=at - timedelta(seconds=1), finished_at=at
        )
    JobFactory.create_batch(3, queue="default", task="tests.echo")
    JobFactory.create_batch(2, queue="imports", task="imports.load")
    JobFactory(queue="imports", task="imports.load", run_after=now + timedelta(hours=2))
    JobFactory(queue="reports", task="reports.build")
    queues.pause("imports", by="operator", reason="supplier feed down")


@pytest.mark.parametrize("width", WIDTHS)
def test_the_dashboard_charts_every_queue_and_fits(browser, live_server, operator, width) -> None:
    fill()
    page = open_page(browser, live_server, width)
    # The index links to the dashboard, and lists no "Dashboard" model row.
    assert page.locator("tr.model-dashboard").count() == 0
    page.click("#dj-dashboard-link")
    page.wait_for_selector("#dj-queues")
    assert page.locator(".breadcrumbs").inner_text().endswith("Dashboard")
    names = page.locator("#dj-queues tbody tr td:first-child a").all_inner_texts()
    assert {"default", "imports", "reports", "emails"} <= set(names)
    default = page.locator("#dj-queues tbody tr:has(td a:text-is('default'))").locator("td")
    assert default.nth(1).inner_text() == "3"  # ready
    imports = page.locator("#dj-queues tbody tr:has(td a:text-is('imports'))")
    assert imports.locator("td").nth(2).inner_text() == "1"  # scheduled
    assert "paused" in imports.inner_text() and "supplier feed down" in imports.inner_text()
    chart = page.locator("#dj-throughput svg")
    assert "attempts per hour" in chart.inner_html()
    assert chart.locator("text.x-label").count() >= 4 and chart.locator("line.grid").count() == 5
    assert chart.locator("rect.done").count() > 0 and chart.locator("rect.failed").count() > 0
    assert "attempts failed" in page.locator("#dj-throughput figcaption").inner_text()
    shoot(page, "dashboard", width)

    day = chart.inner_html()
    page.click(".dj-range a:text-is('7 d')")
    page.wait_for_url("**/?range=7d")
    week = page.locator("#dj-throughput svg").inner_html()
    assert week != day and page.locator("#dj-throughput svg rect.done").count() > 5
    page.click(".dj-range a:text-is('1 h')")
    page.wait_for_url("**/?range=1h")
    hour = page.locator("#dj-throughput svg")
    assert "attempts per minute" in hour.inner_html() and hour.locator("rect.done").count() > 5
    assert_fits(page)
    page.context.close()


def test_a_user_without_view_job_sees_no_dashboard_link(browser, live_server) -> None:
    UserFactory(username="tokens", password=PASSWORD, permissions=["view_apitoken"])
    page = open_page(browser, live_server, WIDTHS[0], username="tokens")
    assert page.locator("#dj-dashboard-link").count() == 0
    assert page.locator("tr.model-dashboard").count() == 0
    page.context.close()


@pytest.mark.parametrize("width", WIDTHS)
def test_the_queues_page_pauses_and_limits_every_queue(
    browser, live_server, operator, width
) -> None:
    fill()
    page = open_page(browser, live_server, width)
    page.goto(f"{live_server.url}/admin/django_jobs/queue/")
    names = page.locator("#dj-queues tbody tr td:first-child > a").all_inner_texts()
    assert {"default", "imports", "reports", "emails"} <= set(names)
    row = page.locator("#dj-queues tbody tr:has(td > a:text-is('default'))")
    assert row.locator("td").nth(1).inner_text() == "3"
    shoot(page, "queues", width)

    row.locator("input[name=reason]").fill("deploy")
    row.locator("button:text-is('Pause')").click()
    page.wait_for_selector(".messagelist .success")
    assert page.url.endswith("/admin/django_jobs/queue/")
    assert Queue.objects.get(name="default").paused
    row = page.locator("#dj-queues tbody tr:has(td > a:text-is('default'))")
    row.locator("input[name=limit]").fill("4")
    row.locator("button:text-is('Set')").click()
    page.wait_for_selector(".messagelist .success")
    assert Queue.objects.get(name="default").concurrency_limit == 4
    row = page.locator("#dj-queues tbody tr:has(td > a:text-is('default'))")
    assert row.locator("input[name=limit]").input_value() == "4"
    row.locator("a:text-is('controls')").click()
    page.wait_for_selector("#queue_form")
    page.context.close()


@pytest.mark.parametrize("width", WIDTHS)
def test_a_token_is_made_shown_once_copied_and_revoked(
    browser, live_server, operator, width
) -> None:
    from django_jobs.tokens import auth

    auth.create("ci-deploy", ["default"], can_enqueue=True, tasks=["tests.echo"])
    old, _ = auth.create("old-fleet", ["reports"])
    auth.revoke([old.pk])
    page = open_page(browser, live_server, width)
    page.goto(f"{live_server.url}/admin/django_jobs/apitoken/")
    page.click(".object-tools a.addlink")
    page.fill("#id_name", "fleet")
    page.fill("#id_queues", "default, reports")
    page.fill("#id_expires", "90d")
    page.click("input[name=_save]")
    page.wait_for_selector("#api-token")
    secret = page.locator("#api-token").inner_text()
    assert secret.startswith("djt_") and ApiToken.objects.filter(name="fleet").exists()
    assert page.locator("#dj-copy-token").is_visible()
    shoot(page, "token-created", width)
    page.click("#dj-copy-token")
    page.wait_for_function("document.getElementById('dj-copy-note').textContent !== ''")

    page.goto(f"{live_server.url}/admin/django_jobs/apitoken/")
    assert secret not in page.content()
    row = page.locator("#result_list tbody tr:has(th a:text-is('fleet'))")
    assert "active" in row.inner_text() and "default, reports" in row.inner_text()
    revoked = page.locator("#result_list tbody tr:has(th a:text-is('old-fleet'))")
    assert "revoked" in revoked.inner_text()
    shoot(page, "tokens", width)

    row.locator("th a").click()
    assert secret not in page.content()  # the token's page never shows it again
    page.click("#dj-revoke-token")
    assert ApiToken.objects.get(name="fleet").revoked_at is None  # it asks first
    page.click("#dj-confirm-revoke")
    page.wait_for_selector(".messagelist .success")
    assert ApiToken.objects.get(name="fleet").revoked_at is not None
    page.context.close()
