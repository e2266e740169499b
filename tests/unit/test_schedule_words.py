"""A schedule's cron expression in plain words: the common shapes are said exactly, and any
other shape is not said at all (the caller then shows the expression), never said wrongly."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from django_jobs.schedules.reading import clock, in_words, reads_differently, upcoming


@pytest.mark.parametrize(
    ("expression", "words"),
    [
        ("30 6 * * mon-fri", "at 06:30, Monday to Friday"),
        ("30 6 * * 1-5", "at 06:30, Monday to Friday"),
        ("30  6 * *  MON-FRI", "at 06:30, Monday to Friday"),
        ("* * * * *", "every minute"),
        ("*/1 * * * *", "every minute"),
        ("*/15 * * * *", "every 15 minutes"),
        ("*/15 9-17 * * mon-fri", "every 15 minutes from 09:00 to 17:45, Monday to Friday"),
        ("*/5 9 * * *", "every 5 minutes from 09:00 to 09:55"),
        ("* 9-10 * * *", "every minute from 09:00 to 10:59"),
        ("5 * * * *", "every hour at :05"),
        ("0,30 * * * *", "every hour at :00 and :30"),
        ("0 */6 * * *", "every 6 hours from 00:00"),
        ("0 9-17 * * 1-5", "every hour from 09:00 to 17:00, Monday to Friday"),
        ("30 6 * * *", "at 06:30, every day"),
        ("0 6,18 * * *", "at 06:00 and 18:00, every day"),
        ("0,30 9 * * *", "at 09:00 and 09:30, every day"),
        ("0 0 * * 0", "at 00:00, every Sunday"),
        ("0 0 * * 7", "at 00:00, every Sunday"),
        ("0 0 * * sat,sun", "at 00:00, every Saturday and Sunday"),
        ("0 0 * * 1-3,5", "at 00:00, Monday to Wednesday and Friday"),
        ("0 0 * * 5-7", "at 00:00, Friday to Sunday"),
        ("0 0 * * 0-6", "at 00:00, every day"),
        ("0 0 1 * *", "at 00:00, on the 1st of each month"),
        ("15 14 2,3,11,22 * *", "at 14:15, on the 2nd, 3rd, 11th and 22nd of each month"),
        ("0 8 1-7 * *", "at 08:00, on the 1st to 7th of each month"),
        ("0 0 * 1,7 *", "at 00:00, every day, in January and July"),
        ("0 0 * 3-10 *", "at 00:00, every day, from March to October"),
        ("0 0 * jan-mar mon", "at 00:00, every Monday, from January to March"),
        ("0 0 15 jun *", "at 00:00, on the 15th, in June"),
        ("@hourly", "every hour at :00"),
        ("@daily", "at 00:00, every day"),
        ("@midnight", "at 00:00, every day"),
        ("@weekly", "at 00:00, every Sunday"),
        ("@monthly", "at 00:00, on the 1st of each month"),
        ("@yearly", "at 00:00, on the 1st, in January"),
        ("@annually", "at 00:00, on the 1st, in January"),
        # Repeated values are said once, and 7 is Sunday as 0 is.
        ("0 0 * * 0,7", "at 00:00, every Sunday"),
        ("0 0 * * sun,7,mon", "at 00:00, every Sunday and Monday"),
        ("0,0,0 * * * *", "every hour at :00"),
        ("30,0 * * * *", "every hour at :00 and :30"),
        ("0 6,6 1,1 * *", "at 06:00, on the 1st of each month"),
        # A range of minutes is said as one, not minute by minute.
        ("0-30 * * * *", "every minute from :00 to :30 of each hour"),
        ("0-30 9 * * mon-fri", "every minute from 09:00 to 09:30, Monday to Friday"),
    ],
)
def test_a_common_shape_is_said_in_words(expression: str, words: str) -> None:
    assert in_words(expression) == words


@pytest.mark.parametrize(
    "expression",
    [
        "0 0 L * *",  # the last day of the month
        "0 0 LW * *",
        "0 0 15W * *",
        "0 0 * * 1#2",  # the second Monday
        "0 0 * * 5L",
        "0 0 1 * mon",  # day of month OR Monday: cron's "or" reads wrongly in words
        "0 0 */2 * *",
        "0 0 * */3 *",
        "0 0 * * */2",
        "*/7 * * * *",  # restarts at :00 each hour: not every 7 minutes
        "0 */5 * * *",  # restarts at midnight: not every 5 hours
        "1-10/2 * * * *",  # a stepped range
        "0 9-17/2 * * *",
        "*/15 9,17 * * *",  # minutes over two separate hours
        "0,10,20,30 6,12 * * *",  # eight times a day: too many to list
        "0,5,10,15,20,25,30 * * * *",  # seven minutes of each hour: too many to list
        "0-30 9,17 * * *",  # a range of minutes in two separate hours
        "0 0 * * fri-mon",  # a range backwards
        "61 * * * *",  # not valid cron
        "every day",
        "@sometimes",
        "",
    ],
)
def test_a_shape_it_cannot_say_exactly_is_not_said(expression: str) -> None:
    assert in_words(expression) is None


def test_a_time_is_read_on_the_schedules_clock_with_its_zone_named() -> None:
    now = datetime(2026, 12, 5, 12, tzinfo=UTC)
    moment = datetime(2026, 12, 7, 5, 30, tzinfo=UTC)
    assert clock(moment, "Europe/Paris", now) == "Mon 7 Dec 06:30 Europe/Paris"
    assert clock(moment, "UTC", now, seconds=True) == "Mon 7 Dec 05:30:00 UTC"
    next_year = datetime(2027, 1, 1, 14, tzinfo=UTC)
    assert clock(next_year, "America/New_York", now) == "Fri 1 Jan 2027 09:00 America/New_York"


def test_two_zones_read_differently_only_when_their_clocks_differ() -> None:
    winter = datetime(2026, 12, 7, 5, 30, tzinfo=UTC)
    assert reads_differently(winter, "Europe/Paris", "UTC")
    assert not reads_differently(winter, "Europe/Paris", "Europe/Berlin")
    assert not reads_differently(winter, "UTC", "Etc/UTC")


def test_the_next_runs_follow_the_zones_daylight_saving_changes() -> None:
    # Paris changes to summer time on Sunday 29 March 2026: 06:30 is then 04:30 UTC.
    after = datetime(2026, 3, 26, 12, tzinfo=UTC)
    runs = upcoming("30 6 * * *", "Europe/Paris", after, count=5)
    assert [(r.day, r.hour, r.minute) for r in runs] == [
        (27, 5, 30),
        (28, 5, 30),
        (29, 4, 30),
        (30, 4, 30),
        (31, 4, 30),
    ]
    assert upcoming("61 * * * *", "UTC", after) == []
    assert upcoming("0 3 * * *", "Mars/Olympus", after) == []
