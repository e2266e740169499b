"""The schedules in a real browser, at the console's widths: the list (expressions on one line
with their words, times on each schedule's own clock, nothing cut off) and a schedule's page
(its words, its zone, the server's time beside it, and its next five runs as cronsim counts
them). The screenshots are those docs/admin.md shows."""

from __future__ import annotations

import itertools
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from cronsim import CronSim
from django.utils import timezone

from django_jobs.models import Schedule
from tests.factories import JobFactory, ScheduleFactory
from tests.system.helpers import WIDTHS, assert_fits, open_page, shoot

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser]

PARIS = "Europe/Paris"


def make_schedules() -> Schedule:
    """A team's schedules: one per common shape and zone, one paused, one whose last run
    failed, long names. Returns the Paris one, whose last run failed."""
    ran = timezone.now() - timedelta(hours=3)
    failed = JobFactory(
        task="tests.echo", state="error", attempt=1, finished_at=ran, error="ConnectionError"
    )
    done = JobFactory(task="tests.echo", finished=True)
    paris = ScheduleFactory(
        name="partner-invoices-morning-export-to-accounting",
        cron="30 6 * * mon-fri",
        timezone=PARIS,
        last_run_at=ran,
        last_job_id=failed.pk,
        last_outcome="error: ConnectionError: partner API at https://api.partner.example",
    )
    ScheduleFactory(
        name="feed-poller",
        cron="*/15 * * * *",
        timezone="UTC",
        last_run_at=ran,
        last_job_id=done.pk,
        last_outcome="enqueued",
    )
    ScheduleFactory(
        name="monthly statements for the New York branch",
        cron="0 9 1 * *",
        timezone="America/New_York",
    )
    ScheduleFactory(name="weekly-cleanup", cron="@weekly", timezone="UTC").pause("operator")
    ScheduleFactory(name="nightly-report", cron="0 3 * * *", timezone="UTC", source="code")
    ScheduleFactory(name="quarter-end", cron="0 0 L 3,6,9,12 *", timezone="Asia/Tokyo")
    return paris


def walls(expression: str, zone: str, count: int) -> list[datetime]:
    """cronsim's own next local times of ``expression``, after now on ``zone``'s clock."""
    local = timezone.now().astimezone(ZoneInfo(zone)).replace(tzinfo=None, microsecond=0)
    return list(itertools.islice(CronSim(expression, local), count))


@pytest.mark.parametrize("width", WIDTHS)
def test_the_schedule_list_reads_each_schedule_on_its_own_clock_and_fits(
    browser,
    live_server,
    operator,
    width,
) -> None:
    paris = make_schedules()
    page = open_page(browser, live_server, width)
    page.goto(f"{live_server.url}/admin/django_jobs/schedule/")

    row = page.locator("#result_list tbody tr", has_text=paris.name)
    assert row.locator(".dj-cron").inner_text() == "30 6 * * mon-fri"
    assert row.locator(".dj-cron").evaluate("e => getComputedStyle(e).whiteSpace") == "nowrap"
    words = row.locator(".dj-cron-words").inner_text()
    assert words == "at 06:30, Monday to Friday, Europe/Paris time"
    next_run = row.locator("td.field-next_run").inner_text()
    assert next_run.split("\n")[0].endswith("06:30 Europe/Paris")
    assert "server: " in next_run and next_run.endswith(" UTC")
    assert "ConnectionError" in row.locator("td.field-last_outcome_text").inner_text()
    for column in ("last_run", "last_outcome_text"):
        assert row.locator(f"td.field-{column}").is_visible()

    # A shape not said in words shows its expression alone; a UTC schedule no server time.
    quarter = page.locator("#result_list tbody tr", has_text="quarter-end")
    assert quarter.locator(".dj-cron-words").inner_text() == "Asia/Tokyo time"
    poller = page.locator("#result_list tbody tr", has_text="feed-poller")
    assert poller.locator(".dj-cron-words").inner_text() == "every 15 minutes, UTC time"
    assert poller.locator(".dj-server-time").count() == 0
    shoot(page, "schedules", width)
    page.context.close()


@pytest.mark.parametrize("width", WIDTHS)
def test_a_schedules_page_shows_its_words_zone_and_next_five_runs_as_cronsim_counts(
    browser,
    live_server,
    operator,
    width,
) -> None:
    paris = make_schedules()
    page = open_page(browser, live_server, width)
    page.goto(f"{live_server.url}/admin/django_jobs/schedule/{paris.pk}/change/")

    reading = page.locator(".dj-reading")
    assert "at 06:30, Monday to Friday" in reading.locator(".dj-cron-said").inner_text()
    assert reading.locator(".dj-zone").inner_text() == ("Europe/Paris (the server's is UTC)")
    runs = reading.locator(".dj-next-fires li")
    assert runs.count() == 5
    paris_zone = ZoneInfo(PARIS)
    for i, wall in enumerate(walls("30 6 * * mon-fri", PARIS, 5)):
        shown = runs.nth(i).locator("time")
        moment = datetime.fromisoformat(shown.get_attribute("datetime"))
        assert moment.astimezone(paris_zone).replace(tzinfo=None) == wall
        text = shown.inner_text()
        assert text.startswith(f"{wall:%a} {wall.day} {wall:%b}")
        assert text.endswith(f"{wall:%H:%M} Europe/Paris")
        server = moment.astimezone(ZoneInfo("UTC"))
        assert runs.nth(i).locator(".dj-server-time").inner_text().endswith(f"{server:%H:%M} UTC")
    shoot(page, "schedule", width)
    page.context.close()


def test_the_add_form_reads_the_expression_as_it_is_typed(browser, live_server, operator) -> None:
    page = open_page(browser, live_server, 1280)
    page.goto(f"{live_server.url}/admin/django_jobs/schedule/add/")
    box = page.locator(".dj-reading-body")
    assert "Type a cron expression" in box.inner_text()

    page.fill("#id_timezone", PARIS)
    page.fill("#id_cron", "30 6 * * mon-fri")
    box.locator(".dj-next-fires li").nth(4).wait_for()
    assert "at 06:30, Monday to Friday" in box.locator(".dj-cron-said").inner_text()
    first = datetime.fromisoformat(
        box.locator(".dj-next-fires time").first.get_attribute("datetime")
    )
    assert (
        first.astimezone(ZoneInfo(PARIS)).replace(tzinfo=None)
        == walls("30 6 * * mon-fri", PARIS, 1)[0]
    )
    shoot(page, "schedule-add", 1280)

    page.fill("#id_cron", "30 6 * *")
    page.wait_for_function(
        "document.querySelector('.dj-reading-body').innerText.includes('has 4 field(s)')"
    )
    assert box.locator(".dj-next-fires").count() == 0
    assert not Schedule.objects.exists()  # reading it saved nothing
    assert_fits(page)
    page.context.close()
