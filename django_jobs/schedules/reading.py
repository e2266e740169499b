"""How an operator reads a schedule: its cron expression in plain words, and its times on the
schedule's own clock, with the zone named.

:func:`in_words` says only what it can say exactly. It reads the common shapes (every N
minutes, hourly at :MM, daily at HH:MM, ranges and lists of weekdays, days of the month,
months, the ``@daily`` shortcuts) and returns ``None`` for anything else, so that the caller
shows the expression itself rather than words that could be wrong. Pure functions, no database.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator
from datetime import datetime
from zoneinfo import ZoneInfo

from django_jobs.exceptions import InvalidOption
from django_jobs.schedules import cron

DAYS = ["Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"]
MONTHS = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
]
#: The names cron accepts for days (``sun``-``sat``, and 7 for Sunday) and months (``jan``-``dec``).
DAY_NAMES = {name[:3].lower(): i for i, name in enumerate(DAYS)}
MONTH_NAMES = {name[:3].lower(): i + 1 for i, name in enumerate(MONTHS)}

#: Most times of day listed one by one ("at 06:00, 12:00 and 18:00"); more are not said.
MOST_TIMES = 6


@dataclasses.dataclass(frozen=True)
class Field:
    """One field of a cron expression, read: every value (``*``), every ``step`` from the
    field's lowest value (``*/step``), or the listed values."""

    every: bool = False
    step: int = 0
    #: The values of a list of numbers and ranges, each range as (first, last).
    ranges: tuple[tuple[int, int], ...] = ()

    @property
    def values(self) -> list[int]:
        return [v for first, last in self.ranges for v in range(first, last + 1)]

    @property
    def one_range(self) -> bool:
        """Whether the field is one range of several values (``9-17``)."""
        return len(self.ranges) == 1 and self.ranges[0][0] < self.ranges[0][1]


def _field(text: str, low: int, high: int, names: dict[str, int] | None = None) -> Field | None:
    """``text`` read as a field whose values run from ``low`` to ``high``; None for a shape that
    is not said in words (``L``, ``W``, ``#``, ``?``, a stepped range, a range backwards)."""
    if text == "*":
        return Field(every=True)
    if text.startswith("*/"):
        step = _number(text[2:], 1, high - low + 1, None)
        return None if step is None else Field(every=step == 1, step=0 if step == 1 else step)
    ranges = []
    for part in text.split(","):
        first_text, dash, last_text = part.partition("-")
        first = _number(first_text, low, high, names)
        last = _number(last_text, low, high, names) if dash else first
        if first is None or last is None or last < first:
            return None
        ranges.append((first, last))
    return Field(ranges=tuple(dict.fromkeys(ranges)))  # each once, in the order written


def _number(text: str, low: int, high: int, names: dict[str, int] | None) -> int | None:
    if names is not None and text.lower() in names:
        return names[text.lower()]
    if not text.isascii() or not text.isdigit():
        return None
    value = int(text)
    return value if low <= value <= high else None


def in_words(expression: str) -> str | None:
    """``expression`` in plain words ("at 06:30, Monday to Friday" for ``30 6 * * mon-fri``),
    or None when it is not valid cron or its shape is not one said in words."""
    try:
        text = cron.expand(expression)
    except InvalidOption:
        return None
    minute_text, hour_text, dom_text, month_text, dow_text = text.split(" ")
    minute = _field(minute_text, 0, 59)
    hour = _field(hour_text, 0, 23)
    dom = _field(dom_text, 1, 31)
    month = _field(month_text, 1, 12, MONTH_NAMES)
    dow = _field(dow_text, 0, 7, DAY_NAMES)
    if minute is None or hour is None or dom is None or month is None or dow is None:
        return None
    if dow.ranges:  # 7 is Sunday, as 0 is: "0,7" is one day
        sunday = ((0, 0) if r == (7, 7) else r for r in dow.ranges)
        dow = dataclasses.replace(dow, ranges=tuple(dict.fromkeys(sunday)))
    if not (dom.every or dow.every) or dom.step or month.step or dow.step:
        # Both day fields set: cron runs on either (an "or" that reads wrongly in words).
        return None
    times = _times(minute, hour)
    days = _days(dom, month, dow)
    if times is None or days is None:
        return None
    if days == "every day" and not times.startswith("at "):
        return times  # "every 15 minutes" needs no "every day"
    return f"{times}, {days}"


def _times(minute: Field, hour: Field) -> str | None:
    """When in the day: "every 15 minutes", "every hour at :05", "at 06:30 and 18:30"."""
    if minute.every:
        if hour.every:
            return "every minute"
        span = _hours_span(hour)
        return f"every minute {span}" if span else None
    if minute.step:
        if 60 % minute.step:  # */7 restarts at :00 each hour: not "every 7 minutes"
            return None
        every = f"every {minute.step} minutes"
        if hour.every:
            return every
        span = _hours_span(hour, last_minute=60 - minute.step)
        return f"{every} {span}" if span else None
    if minute.one_range:  # "0-30": every minute of a span, said as one
        first, last = minute.ranges[0]
        if hour.every:
            return f"every minute from :{first:02} to :{last:02} of each hour"
        if len(hour.values) == 1:
            at = hour.values[0]
            return f"every minute from {at:02}:{first:02} to {at:02}:{last:02}"
        return None
    minutes = sorted(set(minute.values))
    if len(minutes) > MOST_TIMES:
        return None
    if hour.every:
        return "every hour at " + _and([f":{m:02}" for m in minutes])
    if hour.step:
        if 24 % hour.step or len(minutes) != 1:
            return None
        return f"every {hour.step} hours from 00:{minutes[0]:02}"
    if len(minutes) == 1 and hour.one_range:
        first, last = hour.ranges[0]
        return f"every hour from {first:02}:{minutes[0]:02} to {last:02}:{minutes[0]:02}"
    hours = sorted(set(hour.values))
    moments = [f"{h:02}:{m:02}" for h, m in itertools.product(hours, minutes)]
    if len(moments) > MOST_TIMES:
        return None
    return "at " + _and(moments)


def _hours_span(hour: Field, last_minute: int = 59) -> str | None:
    """The hours a minute-level expression runs in, when they are one range: "from 09:00 to
    17:45"."""
    if hour.step or len(hour.ranges) != 1:
        return None
    first, last = hour.ranges[0]
    return f"from {first:02}:00 to {last:02}:{last_minute:02}"


def _days(dom: Field, month: Field, dow: Field) -> str | None:
    """Which days: "Monday to Friday", "on the 1st of each month", "on the 1st, in January";
    empty when every day."""
    if dom.every and dow.every:
        days = "every day" if not month.every else ""
    elif not dow.every:
        days = _and([_day_range(first, last) for first, last in dow.ranges])
        if all(first == last for first, last in dow.ranges):
            days = f"every {days}"
    else:
        days = "on the " + _and([_ordinal_range(first, last) for first, last in dom.ranges])
    if month.every:
        if not dom.every:
            return f"{days} of each month"
        return days if days else "every day"
    months = _and([_month_range(first, last) for first, last in month.ranges])
    return f"{days}, {'from' if month.one_range else 'in'} {months}"


def _day_range(first: int, last: int) -> str:
    if first == 0 and last >= 6:
        return "every day"
    name = DAYS[first % 7]
    return name if first == last else f"{name} to {DAYS[last % 7]}"


def _ordinal_range(first: int, last: int) -> str:
    return _ordinal(first) if first == last else f"{_ordinal(first)} to {_ordinal(last)}"


def _month_range(first: int, last: int) -> str:
    name = MONTHS[first - 1]
    return name if first == last else f"{name} to {MONTHS[last - 1]}"


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


# ------------------------------------------------------------------ times on the schedule's clock


def clock(moment: datetime, zone_name: str, now: datetime, seconds: bool = False) -> str:
    """``moment`` on the clock of ``zone_name``, the zone named: "Mon 7 Dec 06:30 Europe/Paris"
    (with the year when it is not ``now``'s)."""
    local = moment.astimezone(ZoneInfo(zone_name))
    year = "" if local.year == now.astimezone(local.tzinfo).year else f" {local.year}"
    time = f"{local:%H:%M:%S}" if seconds else f"{local:%H:%M}"
    return f"{local:%a} {local.day} {local:%b}{year} {time} {zone_name}"


def reads_differently(moment: datetime, zone_name: str, other: str) -> bool:
    """Whether the clocks of the two zones show different times at ``moment``."""
    return (
        moment.astimezone(ZoneInfo(zone_name)).utcoffset()
        != moment.astimezone(ZoneInfo(other)).utcoffset()
    )


def upcoming(expression: str, zone_name: str, after: datetime, count: int = 5) -> list[datetime]:
    """The next ``count`` fire times strictly after ``after``, by the scheduler's own rule
    (:func:`~django_jobs.schedules.cron.fires`, DST included); empty for an expression or zone
    that is not valid."""
    try:
        found: Iterator[datetime] = cron.fires(expression, zone_name, after)
        return list(itertools.islice(found, count))
    except InvalidOption:
        return []
