"""A job's progress, as ``context.progress(done, total, message)`` reports it: the value, and the
rules that make any input into one the database can store.

Bad input never raises into the job: ``done`` below 0 counts as 0, ``done`` past ``total`` as
``total``, a ``total`` that is not above 0 as unknown, and a message longer than
:data:`MESSAGE_CHARS` is cut with an ellipsis. Only a ``done`` or ``total`` that is not a
finite number (a string, ``None``, NaN, infinity, a bool) makes the call change nothing; the
reason is logged (and so lands in the attempt's captured log).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from datetime import datetime
from typing import Any

from django_jobs.storable import storable_text

#: The longest message kept, in characters.
MESSAGE_CHARS = 500


class BadProgress(ValueError):
    """A progress report that cannot be shown at all (not a number)."""


@dataclasses.dataclass(frozen=True)
class Progress:
    """How far one attempt of a job has come."""

    job_id: int
    done: float
    total: float | None = None
    message: str = ""

    @property
    def fraction(self) -> float | None:
        """``done / total`` between 0 and 1, or ``None`` when the total is unknown."""
        if not self.total:
            return None
        return min(1.0, max(0.0, self.done / self.total))


def checked(job_id: int, done: Any, total: Any = None, message: Any = "") -> Progress:
    """``done``, ``total`` and ``message`` made into a :class:`Progress` by the module's rules;
    raises :class:`BadProgress` for a ``done`` or ``total`` that is not a finite number."""
    done = _number("done", done)
    if total is not None:
        total = _number("total", total)
        if total <= 0:
            total = None
    done = max(0.0, done)
    if total is not None:
        done = min(done, total)
    text = storable_text(message if isinstance(message, str) else str(message))
    if len(text) > MESSAGE_CHARS:
        text = text[: MESSAGE_CHARS - 1] + "…"
    return Progress(job_id, done, total, text)


def _number(name: str, value: Any) -> float:
    kind = type(value)
    if kind is int or kind is float:  # the usual case, without the slower ABC check below
        number = float(value)
        if math.isfinite(number):
            return number
    elif kind is bool or not isinstance(value, numbers.Real):
        raise BadProgress(
            f"progress: {name} must be a number, not {type(value).__name__} ({value!r:.50})"
        )
    number = float(value)
    if not math.isfinite(number):
        raise BadProgress(f"progress: {name} must be a finite number, not {number}")
    return number


@dataclasses.dataclass(frozen=True)
class Shown:
    """A job's progress as the admin and ``jobstats`` show it: with its rate and the time left,
    judged from the attempt's start to the last update."""

    done: float
    total: float | None
    message: str
    updated_at: datetime | None
    started_at: datetime | None

    @property
    def fraction(self) -> float | None:
        if not self.total:
            return None
        return min(1.0, max(0.0, self.done / self.total))

    @property
    def percent(self) -> str:
        fraction = self.fraction
        return "" if fraction is None else f"{fraction:.0%}"

    @property
    def rate(self) -> float | None:
        """Units done per second, from the attempt's start to the last update."""
        if self.updated_at is None or self.started_at is None or self.done <= 0:
            return None
        seconds = (self.updated_at - self.started_at).total_seconds()
        return self.done / seconds if seconds > 0 else None

    @property
    def eta_seconds(self) -> float | None:
        """Seconds left at the rate so far, counted from the last update; needs the total."""
        rate = self.rate
        if self.total is None or rate is None:
            return None
        return max(0.0, (self.total - self.done) / rate)


def count(value: float) -> str:
    """``1234.0`` as ``"1,234"``, ``2.5`` as ``"2.5"``."""
    return f"{value:,.0f}" if value == int(value) else f"{value:,.2f}".rstrip("0")
