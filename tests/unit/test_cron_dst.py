"""Fire times across daylight saving changes, for every cron syntax, against a reference.

The reference knows nothing of cronsim or of :mod:`django_jobs.schedules.cron`: it walks the
real clock minute by minute with :mod:`zoneinfo`, reads the local wall clock at each minute,
matches it with a small cron matcher of its own, and applies the rule the README documents
(*Time zones and DST*):

- an expression whose hour field covers every hour fires whenever the local clock shows one of
  its times (both passes of a repeated hour; nothing for a time that does not exist);
- any other fires at the first moment the local clock reaches each of its times: once when the
  clock jumps past one or more of them, once at the first pass of a repeated time.

Each zone's changes in 2026 (found by scanning its offsets), and ordinary days, are compared
over windows of 60 hours, for fixed expressions and for expressions drawn at random (seeded).
"""

from __future__ import annotations

import functools
import itertools
import random
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from django_jobs.schedules import cron

ZONES = [
    "Europe/Berlin",
    "America/New_York",
    "Australia/Lord_Howe",  # shifts by 30 minutes, at 02:00 local
    "America/Santiago",  # southern, changes at midnight (24:00 -> 23:00, 00:00 -> 01:00)
    "UTC",
]
EXPRESSIONS = [
    "*/15 2 * * *",
    "* 2 * * *",
    "0,15,30,45 2 * * *",
    "30 2 29 3 *",
    "30 2 * * *",
    "0 2 * * *",
    "0 * * * *",
    "*/20 * * * *",
    "5,35 * * * *",
    "15 1-3 * * *",
    "0 */2 * * *",
    "45 0 * * *",  # Santiago: in the repeated hour of its autumn change
    "0 0 * * *",  # Santiago: a time its spring change removes
    "10-20/5 1,2 * * *",
    "30 23 * * *",
    "@daily",
    "@hourly",
]
MINUTE = timedelta(minutes=1)
YEAR = 2026


# ---------------------------------------------------------------------- the reference


def _values(field: str, low: int, high: int) -> set[int]:
    """The values of one cron field (``*``, ``a``, ``a-b``, ``*/n``, ``a-b/n``, lists)."""
    found: set[int] = set()
    for part in field.split(","):
        span, _, step = part.partition("/")
        if span == "*":
            first, last = low, high
        elif "-" in span:
            first, last = (int(x) for x in span.split("-"))
        else:
            first = last = int(span)
            if step:
                last = high
        found.update(range(first, last + 1, int(step) if step else 1))
    return found


class Matcher:
    """Whether a wall-clock time is one of an expression's times (5 fields, numbers only)."""

    SHORTCUTS = {"@daily": "0 0 * * *", "@hourly": "0 * * * *"}

    def __init__(self, expression: str) -> None:
        fields = self.SHORTCUTS.get(expression, expression).split()
        self.minutes = _values(fields[0], 0, 59)
        self.hours = _values(fields[1], 0, 23)
        self.days = _values(fields[2], 1, 31)
        self.months = _values(fields[3], 1, 12)
        self.weekdays = {d % 7 for d in _values(fields[4], 0, 7)}
        # As in Vixie cron: a day field starting with "*" (also "*/2") means "and", not "or".
        self.any_day, self.any_weekday = fields[2].startswith("*"), fields[4].startswith("*")
        self.every_hour = len(self.hours) == 24

    def __call__(self, wall: datetime) -> bool:
        if wall.minute not in self.minutes or wall.hour not in self.hours:
            return False
        if wall.month not in self.months:
            return False
        day = wall.day in self.days
        weekday = (wall.isoweekday() % 7) in self.weekdays
        if self.any_day or self.any_weekday:
            return day and weekday
        return day or weekday


@functools.lru_cache(maxsize=64)
def walls(zone: str, start: datetime, end: datetime) -> list[tuple[datetime, datetime]]:
    """Each minute of the real clock in (start, end], with the local wall clock's time then."""
    tz = ZoneInfo(zone)
    found = []
    moment = start + MINUTE
    while moment <= end:
        found.append((moment, moment.astimezone(tz).replace(tzinfo=None)))
        moment += MINUTE
    return found


def reference(expression: str, zone: str, start: datetime, end: datetime) -> list[datetime]:
    """The fire times in (start, end], minute by minute of the real clock."""
    matches = Matcher(expression)
    reached = start.astimezone(ZoneInfo(zone)).replace(tzinfo=None)  # latest wall time so far
    found = []
    for moment, wall in walls(zone, start, end):
        if matches.every_hour:
            fires = matches(wall)
        else:
            fires = False
            passed = reached + MINUTE  # every wall time reached for the first time just now
            while passed <= wall and not fires:
                fires = matches(passed)
                passed += MINUTE
        if fires:
            found.append(moment)
        reached = max(reached, wall)
    return found


def implementation(expression: str, zone: str, start: datetime, end: datetime) -> list[datetime]:
    found = []
    for moment in cron.fires(expression, zone, start):
        if moment > end:
            break
        found.append(moment)
    return found


# ---------------------------------------------------------------------- the windows


def changes(zone: str) -> list[datetime]:
    """The hours of YEAR in which ``zone``'s offset changes (UTC)."""
    tz = ZoneInfo(zone)
    hour = datetime(YEAR, 1, 1, tzinfo=UTC)
    found = []
    offset = hour.astimezone(tz).utcoffset()
    while hour.year == YEAR:
        hour += timedelta(hours=1)
        now = hour.astimezone(tz).utcoffset()
        if now != offset:
            found.append(hour)
            offset = now
    return found


def windows(zone: str) -> Iterator[tuple[datetime, datetime]]:
    """Some 60 hours around each change of the year, and two ordinary days."""
    for change in changes(zone):
        yield change - timedelta(hours=30), change + timedelta(hours=30)
    for ordinary in (datetime(YEAR, 1, 14, tzinfo=UTC), datetime(YEAR, 7, 14, tzinfo=UTC)):
        yield ordinary, ordinary + timedelta(days=1)


def test_the_zones_change_as_expected_in_the_year() -> None:
    assert [len(changes(zone)) for zone in ZONES] == [2, 2, 2, 2, 0]


def _random_field(rng: random.Random, low: int, high: int) -> str:
    kind = rng.choice(["*", "*/n", "a", "a,b", "a-b", "a-b/n"])
    a, b = sorted(rng.sample(range(low, high + 1), 2))
    step = rng.randint(2, max(2, (high - low) // 3))
    return {
        "*": "*",
        "*/n": f"*/{step}",
        "a": f"{a}",
        "a,b": f"{a},{b}",
        "a-b": f"{a}-{b}",
        "a-b/n": f"{a}-{b}/{step}",
    }[kind]


def random_expressions(count: int, seed: int) -> list[str]:
    """Expressions of every syntax, with hours near the changes' (0-3) more often."""
    rng = random.Random(seed)
    found = []
    for _ in range(count):
        minute = _random_field(rng, 0, 59)
        hour = rng.choice([_random_field(rng, 0, 23), _random_field(rng, 0, 3), "*", "2"])
        day = rng.choice(["*", "*", "*", _random_field(rng, 1, 31)])
        month = rng.choice(["*", "*", _random_field(rng, 1, 12)])
        weekday = rng.choice(["*", "*", _random_field(rng, 0, 6)])
        found.append(f"{minute} {hour} {day} {month} {weekday}")
    return found


# ---------------------------------------------------------------------- the properties


def check(expression: str, zone: str) -> None:
    for start, end in windows(zone):
        got = implementation(expression, zone, start, end)
        assert got == sorted(set(got)), f"{expression} in {zone}: out of order or repeated"
        expected = reference(expression, zone, start, end)
        assert got == expected, f"{expression!r} in {zone}, {start:%Y-%m-%d}"


@pytest.mark.parametrize("zone", ZONES)
@pytest.mark.parametrize("expression", EXPRESSIONS)
def test_every_syntax_follows_the_dst_rule(expression: str, zone: str) -> None:
    check(expression, zone)


@pytest.mark.parametrize("zone", ZONES)
def test_random_expressions_follow_the_dst_rule(zone: str) -> None:
    for expression in random_expressions(10, seed=ZONES.index(zone)):
        check(expression, zone)


@pytest.mark.parametrize("zone", ZONES[:4])
@pytest.mark.parametrize(
    "expression", ["*/15 2 * * *", "30 2 * * *", "*/20 * * * *", "5,35 * * * *", "0 0 * * *"]
)
def test_the_next_fire_time_from_any_moment_near_a_change_is_the_references(
    expression: str, zone: str
) -> None:
    # A scheduler asks for the next time after each tick, at any moment: in the hour before a
    # change, in either pass of a repeated hour, right after a jump.
    for change in changes(zone):
        start, end = change - timedelta(hours=30), change + timedelta(hours=30)
        expected = reference(expression, zone, start, end)
        moment = change - timedelta(hours=4)
        while moment < change + timedelta(hours=4):
            following = next(t for t in expected if t > moment)
            assert cron.next_fire(expression, zone, moment) == following, f"after {moment}"
            moment += timedelta(minutes=7, seconds=13)


@pytest.mark.parametrize("zone", ZONES[:4])
@pytest.mark.parametrize("expression", ["* 2 * * *", "*/20 * * * *", "30 2 * * *"])
def test_after_a_long_downtime_the_latest_tick_is_the_references(
    expression: str, zone: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Over cron.MAX_COUNTED missed ticks (10 here), the latest is found without counting them.
    monkeypatch.setattr(cron, "MAX_COUNTED", 10)
    for change in changes(zone):
        start, end = change - timedelta(hours=30), change + timedelta(hours=30)
        expected = reference(expression, zone, start, end)
        moment = change - timedelta(hours=3)
        while moment < change + timedelta(hours=3):
            latest = [t for t in expected if t <= moment][-1]
            due_at = cron.next_fire(expression, zone, moment - timedelta(days=30))
            plan = cron.plan(expression, zone, due_at, moment, cron.CATCH_UP_LATEST, 0)
            assert plan.skipped >= cron.MAX_COUNTED
            assert plan.fire_at == latest, f"at {moment}"
            assert plan.next_run_at == next(t for t in expected if t > moment)
            moment += timedelta(minutes=17, seconds=29)


# ---------------------------------------------------------------------- the table


def runs_on(expression: str, zone: str, day: datetime) -> list[datetime]:
    """The fire times of one local calendar day."""
    tz = ZoneInfo(zone)
    start = day.replace(tzinfo=tz).astimezone(UTC) - timedelta(seconds=1)
    end = (day + timedelta(days=1)).replace(tzinfo=tz).astimezone(UTC) - timedelta(seconds=1)
    return implementation(expression, zone, start, end)


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


SPRING, AUTUMN = datetime(2026, 3, 29), datetime(2026, 10, 25)


@pytest.mark.parametrize("expression", ["*/15 2 * * *", "* 2 * * *", "0,15,30,45 2 * * *"])
def test_minutes_under_a_fixed_hour_fire_once_when_the_clock_jumps(expression: str) -> None:
    assert runs_on(expression, "Europe/Berlin", SPRING) == [utc(2026, 3, 29, 1, 0)]  # 03:00 CEST


@pytest.mark.parametrize(
    ("expression", "count"), [("*/15 2 * * *", 4), ("* 2 * * *", 60), ("0,15,30,45 2 * * *", 4)]
)
def test_minutes_under_a_fixed_hour_fire_once_in_a_repeated_hour(
    expression: str, count: int
) -> None:
    got = runs_on(expression, "Europe/Berlin", AUTUMN)
    assert len(got) == count
    assert got[0] == utc(2026, 10, 25, 0, 0) and got[-1] < utc(2026, 10, 25, 1, 0)  # CEST pass


def test_new_york_stepped_minutes_fire_on_its_spring_forward_day() -> None:
    got = runs_on("*/15 2 * * *", "America/New_York", datetime(2026, 3, 8))
    assert got == [utc(2026, 3, 8, 7, 0)]  # 03:00 EDT


def test_a_missing_time_on_its_one_day_fires_in_order() -> None:
    got = implementation("30 2 29 3 *", "Europe/Berlin", utc(2026, 3, 28), utc(2028, 1, 1))
    assert got == [utc(2026, 3, 29, 1, 0), utc(2027, 3, 29, 0, 30)]


def test_hourly_expressions_keep_their_real_interval() -> None:
    for day in (SPRING, AUTUMN):
        got = runs_on("*/30 * * * *", "Europe/Berlin", day)
        gaps = {b - a for a, b in itertools.pairwise(got)}
        assert gaps == {timedelta(minutes=30)}
