"""Cron expressions of periodic jobs: parsing, the next fire time, and what a late tick does.

Pure functions, no database: the caller passes the database's clock (``now()``), never the
app's. Expressions are standard 5-field cron, parsed by the ``cronsim`` library, which also
handles daylight saving time (a daily 02:30 job runs once on the days the clocks change); the
shortcuts of :data:`SHORTCUTS` are accepted too.
"""

from __future__ import annotations

import dataclasses
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


def fires(expression: str, timezone: str, after: datetime) -> Iterator[datetime]:
    """The fire times strictly after ``after`` (aware), in UTC, in order."""
    start = after.astimezone(zone(timezone))
    for moment in CronSim(expand(expression), start):
        # In the repeated hour of a fall-back day cronsim counts in wall-clock time, and may
        # give the first pass of a time that is already over: that one ran.
        if moment.astimezone(UTC) > after:
            yield moment.astimezone(UTC)


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
    start = (now.replace(microsecond=0) + timedelta(seconds=1)).astimezone(zone(timezone))
    return next(iter(CronSim(expand(expression), start, reverse=True))).astimezone(UTC)
