"""Cron expressions of periodic jobs: parsing, the next fire time, and what a late tick does.

Pure functions, no database: the caller passes the database's clock (``now()``), never the
app's. Expressions are standard 5-field cron, parsed by the ``cronsim`` library, which lists
their local wall-clock times; :func:`fires` turns those into moments by the DST rule the README
documents (a daily 02:30 job runs once on the days the clocks change, and so does each time of
``*/15 2 * * *``); the shortcuts of :data:`SHORTCUTS` are accepted too.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from django_jobs.exceptions import InvalidOption

#: The shortcuts cron knows, as the 5-field expressions they stand for.
SHORTCUTS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}

#: How many missed ticks are counted one by one; a longer downtime reports "at least" this many.
MAX_COUNTED = 1000

CATCH_UP_SKIP, CATCH_UP_LATEST = "skip", "latest"
OVERLAP_ALLOW, OVERLAP_SKIP = "allow", "skip"
#: What a tick does while the queue of its job is paused.
QUEUE_PAUSED_SKIP, QUEUE_PAUSED_ENQUEUE = "skip", "enqueue"


def expand(expression: str) -> str:
    """The 5-field expression of ``expression`` (a shortcut expanded); raise
    :class:`InvalidOption` with a clear message if it is not valid cron."""
    if not isinstance(expression, str) or not expression.strip():
        raise InvalidOption(f"a cron expression must be a non-empty string, not {expression!r}")
    text = " ".join(expression.split())
    text = SHORTCUTS.get(text.lower(), text)
    if text.startswith("@"):
        raise InvalidOption(
            f"unknown cron shortcut {expression!r}; use one of {', '.join(SHORTCUTS)}"
        )
    fields = text.split(" ")
    if len(fields) != 5:
        raise InvalidOption(
            f"cron expression {expression!r} has {len(fields)} field(s); it needs 5: "
            "minute hour day-of-month month day-of-week (e.g. '0 3 * * *')"
        )
    try:
        CronSim(text, datetime(2000, 1, 1, tzinfo=UTC))
    except (CronSimError, ValueError, IndexError) as exc:
        raise InvalidOption(f"invalid cron expression {expression!r}: {exc}") from None
    return text


def zone(name: str) -> ZoneInfo:
    """The time zone named ``name`` (an IANA name such as ``"Europe/Berlin"``)."""
    if not isinstance(name, str) or not name:
        raise InvalidOption(f"timezone must be an IANA time zone name, not {name!r}")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidOption(
            f"unknown timezone {name!r}; use an IANA name such as 'UTC' or 'Europe/Berlin'"
        ) from None


#: More than the largest shift of a local clock at a DST change (two hours, historically):
#: the wall-clock times within this of a moment are the only ones a DST change can move
#: across it.
SHIFT_MARGIN = timedelta(hours=3)


def fires(expression: str, timezone: str, after: datetime) -> Iterator[datetime]:
    """The fire times strictly after ``after`` (aware), in UTC, in order, none twice.

    The expression's times are local wall-clock times of ``timezone`` (cronsim lists them in
    order, on naive datetimes: no DST rule of its own). Each becomes the moments of the rule
    documented in the README (*Time zones and DST*):

    - an expression whose hour field covers every hour runs whenever the local clock shows one
      of its times: it skips the times a spring change removes, and runs in both passes of the
      hour an autumn change repeats, so that it keeps its real interval;
    - any other runs at the first moment the local clock reaches each of its times: a time
      that does not exist fires when the clock jumps past it (once, however many of its times
      the jump skips), and a time that happens twice fires at its first pass only.
    """
    tz = zone(timezone)
    text = expand(expression)
    hourly = _every_hour(text)
    local = after.astimezone(tz)
    # The wall times to look at start at the clock's time now, or, when the clocks go back
    # within the next hours, as far back as they go: the repeated times come again.
    soon = (after + SHIFT_MARGIN).astimezone(tz)
    back = (local.utcoffset() or timedelta(0)) - (soon.utcoffset() or timedelta(0))
    start = local.replace(tzinfo=None, microsecond=0) - max(back, timedelta(0))
    later: list[datetime] = []  # second passes of repeated times (hourly): after the first
    last = after
    for wall in CronSim(text, start):
        first, second = _moments(wall, tz, hourly)
        while later and (first is None or later[0] < first):
            moment = later.pop(0)
            if moment > last:
                last = moment
                yield moment
        if second is not None:
            later.append(second)
        if first is not None and first > last:
            last = first
            yield first
    yield from (moment for moment in later if moment > last)


def _moments(wall: datetime, tz: ZoneInfo, hourly: bool) -> tuple[datetime | None, datetime | None]:
    """The moments (UTC) at which the naive local ``wall`` fires: the first, if any, and a
    second for an hourly expression's time in a repeated hour."""
    early = wall.replace(tzinfo=tz, fold=0).astimezone(UTC)
    late = wall.replace(tzinfo=tz, fold=1).astimezone(UTC)
    if early == late:
        return early, None
    if early < late:  # shown twice: fold=0 is the first pass
        return early, late if hourly else None
    # Does not exist: ``late`` (with the offset after the change) is before the change,
    # ``early`` after it. Hourly expressions skip it; others fire when the clock jumps.
    return (None, None) if hourly else (_change_between(late, early, tz), None)


def _change_between(before: datetime, after: datetime, tz: ZoneInfo) -> datetime:
    """The moment, to the second, at which ``tz``'s offset changes between ``before`` (old
    offset) and ``after`` (new one): the first valid instant after a skipped wall time."""
    old = before.astimezone(tz).utcoffset()
    low, high = int(before.timestamp()), math.ceil(after.timestamp())
    while high - low > 1:  # low has the old offset, high the new
        middle = (low + high) // 2
        if datetime.fromtimestamp(middle, tz).utcoffset() == old:
            low = middle
        else:
            high = middle
    return datetime.fromtimestamp(high, UTC)


@functools.lru_cache(maxsize=256)
def _every_hour(text: str) -> bool:
    """Whether the 5-field expression's hour field covers all 24 hours."""
    hours = text.split(" ")[1]
    day = datetime(2000, 1, 1)
    found = CronSim(f"0 {hours} * * *", day - timedelta(seconds=1))
    return sum(1 for _ in itertools.takewhile(lambda t: t < day + timedelta(days=1), found)) == 24


def next_fire(expression: str, timezone: str, after: datetime) -> datetime:
    """The first fire time strictly after ``after`` (aware), in UTC."""
    return next(fires(expression, timezone, after))


@dataclasses.dataclass(frozen=True)
class Plan:
    """What to do with a schedule whose tick ``due_at`` has come."""

    #: The tick to run, or None when none is run.
    fire_at: datetime | None
    #: Ticks not run (counted up to :data:`MAX_COUNTED`).
    skipped: int
    #: The schedule's next fire time after now.
    next_run_at: datetime

    def skipped_note(self) -> str:
        if not self.skipped:
            return ""
        many = "at least " if self.skipped >= MAX_COUNTED else ""
        return f"skipped {many}{self.skipped} missed tick{'s' if self.skipped != 1 else ''}"


def plan(
    expression: str, timezone: str, due_at: datetime, now: datetime, catch_up: str, grace: float
) -> Plan:
    """Decide a due schedule's tick at the database's ``now``: the latest tick at or before
    ``now`` runs (with ``catch_up`` ``"skip"`` only if it is at most ``grace`` seconds old);
    every older missed tick is skipped. Never more than one run: a downtime does not flood."""
    due = [due_at]
    upcoming_fires = fires(expression, timezone, due_at)
    upcoming = next(upcoming_fires)
    while upcoming <= now:
        if len(due) > MAX_COUNTED:  # a long downtime: jump to now rather than count every tick
            due.append(_latest_before(expression, timezone, now))
            upcoming = next_fire(expression, timezone, now)
            break
        due.append(upcoming)
        upcoming = next(upcoming_fires)
    latest = due[-1]
    late = (now - latest).total_seconds()
    runs = catch_up == CATCH_UP_LATEST or late <= grace
    return Plan(
        fire_at=latest if runs else None,
        skipped=len(due) - 1 if runs else len(due),
        next_run_at=upcoming,
    )


def _latest_before(expression: str, timezone: str, now: datetime) -> datetime:
    """The last fire time at or before ``now``."""
    tz = zone(timezone)
    text = expand(expression)
    local_now = now.astimezone(tz).replace(tzinfo=None)
    # A time of the expression well before now (cronsim walks back over naive wall times);
    # its moments and every later one up to now are then found forward, by the rule of fires().
    earlier = CronSim(text, local_now + SHIFT_MARGIN, reverse=True)
    wall = next(wall for wall in earlier if wall < local_now - SHIFT_MARGIN)
    start = wall.replace(tzinfo=tz).astimezone(UTC) - SHIFT_MARGIN
    latest = start
    for moment in fires(expression, timezone, start):
        if moment > now:
            break
        latest = moment
    return latest
