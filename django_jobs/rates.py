"""Rate limits as people write them: ``"10/s"``, ``"100/m"``, ``"1000/h"``, ``"10/2s"``,
``"5/30m"``: at most N starts in any window of that length (a sliding window; see
``django_jobs_rate_room`` in django_jobs/store/sql/functions/ for how the claim counts it).

Pure: nothing here reads the database or the settings.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from django_jobs.exceptions import InvalidOption

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_RATE = re.compile(
    r"^\s*(?P<count>[0-9]{1,10})\s*/\s*(?P<length>[0-9]{0,10})\s*(?P<unit>[smhd])\s*$"
)
#: The largest number of starts a window may hold: the claim keeps one timestamp per start of
#: the current window, in one row per key.
MAX_COUNT = 10_000
#: The longest window: a week.
MAX_PERIOD = 7 * 86400


@dataclasses.dataclass(frozen=True)
class Rate:
    """At most :attr:`limit` starts in any window of :attr:`period` seconds."""

    limit: int
    period: int

    def __str__(self) -> str:
        return spell(self.limit, self.period)


def spell(limit: int, period: int) -> str:
    """The usual spelling of a rate: ``spell(10, 2) == "10/2s"``, ``spell(100, 60) == "100/m"``."""
    for unit, seconds in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if period % seconds == 0:
            count = period // seconds
            return f"{limit}/{unit}" if count == 1 else f"{limit}/{count}{unit}"
    raise AssertionError("a period is a whole number of seconds")


def parse_rate(value: Any, what: str = "rate_limit") -> Rate:
    """``value`` (``"10/s"``, ``"5/30m"``, or a :class:`Rate`) as a :class:`Rate`; raises
    :class:`InvalidOption` naming ``what`` for anything else."""
    if isinstance(value, Rate):
        return value
    match = _RATE.match(value) if isinstance(value, str) else None
    if match is None:
        raise InvalidOption(
            f"{what} must look like '10/s', '100/m', '1000/h', '10/2s' or '5/30m'"
            f" (starts per window), not {value!r}"
        )
    limit = int(match["count"])
    period = int(match["length"] or 1) * _UNITS[match["unit"]]
    if not 1 <= limit <= MAX_COUNT:
        raise InvalidOption(
            f"{what} {value!r} allows {limit} starts: a rate allows from 1 to {MAX_COUNT}"
            " (pause the queue to start none)"
        )
    if not 1 <= period <= MAX_PERIOD:
        raise InvalidOption(
            f"{what} {value!r} has a window of {period} s: a window is from 1 s to 7 days"
        )
    return Rate(limit, period)
