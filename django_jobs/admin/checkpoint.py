"""A job's page in the admin lists what the job kept of its work: its recorded steps
(``context.step()``) and its cursors (``context.save_cursor()``), which a retry resumes from and a
retry from the start forgets.

Steps are read in one statement (:func:`~django_jobs.store.latest_steps`), their results left in
the database: the page shows each step's name, the attempt that recorded it, when, how long its
function ran and the size of its result, for the last :data:`SHOWN` steps, and how many it leaves
out. Cursors are on the job's row, which the page has already read; their values are masked as
the job's arguments are.
"""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connections

from django_jobs import conf, store
from django_jobs.admin.display import duration, timestamp
from django_jobs.models.job import Job
from django_jobs.sanitize import mask_text, mask_value

#: At most this many steps (the last ones recorded) and cursors are listed on a job's page.
SHOWN = 200


@dataclasses.dataclass(frozen=True)
class StepRow:
    name: str
    attempt: int
    recorded_at: str
    duration: str
    size: str


@dataclasses.dataclass(frozen=True)
class CursorRow:
    name: str
    #: The value as compact JSON, masked.
    value: str
    attempt: int | str
    saved_at: str


@dataclasses.dataclass(frozen=True)
class JobCheckpoint:
    """What a job's page shows of its steps and cursors (the template's ``job_checkpoint``)."""

    steps: list[StepRow]
    step_total: int
    cursors: list[CursorRow]
    cursor_total: int

    @property
    def empty(self) -> bool:
        return not self.step_total and not self.cursor_total

    @property
    def step_count(self) -> str:
        return f"{self.step_total:,}"

    @property
    def cursor_count(self) -> str:
        return f"{self.cursor_total:,}"

    @property
    def steps_note(self) -> str:
        """Under a list of steps that leaves some out: how many, and where they all are."""
        left_out = self.step_total - len(self.steps)
        if not left_out:
            return ""
        return (
            f"The last {len(self.steps):,} of {self.step_total:,} steps; the {left_out:,} "
            "recorded before them are not shown (all are in the django_jobs_steps view)."
        )

    @property
    def cursors_note(self) -> str:
        left_out = self.cursor_total - len(self.cursors)
        if not left_out:
            return ""
        return (
            f"The first {len(self.cursors):,} of {self.cursor_total:,} cursors by name; "
            f"{left_out:,} more are not shown."
        )

    def kept(self) -> str:
        """What a retry resumes from: ``"3 recorded steps and 1 cursor"``, or ``""``."""
        parts = []
        if self.step_total:
            parts.append(plural(self.step_total, "recorded step"))
        if self.cursor_total:
            parts.append(plural(self.cursor_total, "cursor"))
        return " and ".join(parts)

    def resumes_from(self) -> str:
        """The retry button's words for it: ``"steps and cursors"``, ``"steps"``, or ``""``."""
        return " and ".join(
            what for what, n in (("steps", self.step_total), ("cursors", self.cursor_total)) if n
        )


def plural(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def size(n: int) -> str:
    """A result's size: ``"5 B"``, ``"1.5 KiB"``, ``"2.0 MiB"``."""
    if n < 1024:
        return f"{n:,} B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB"):
        value /= 1024
        if value < 1024 or unit == "GiB":
            break
    return f"{value:,.1f} {unit}"


def job_checkpoint(job: Job) -> JobCheckpoint:
    """The steps (one statement) and the cursors (from ``job``'s row) of ``job``'s page."""
    with connections[conf.database_alias()].cursor() as cursor:
        latest = store.latest_steps(cursor, job.pk, SHOWN)
    steps = [
        StepRow(
            name=mask_text(step.name),
            attempt=step.attempt,
            recorded_at=timestamp(step.recorded_at),
            duration=duration(timedelta(seconds=step.duration)),
            size=size(step.result_bytes),
        )
        for step in latest.steps
    ]
    cursors = job.cursors if isinstance(job.cursors, dict) else {}
    names = sorted(cursors)[:SHOWN]
    return JobCheckpoint(
        steps=steps,
        step_total=latest.total,
        cursors=[cursor_row(name, cursors[name]) for name in names],
        cursor_total=len(cursors),
    )


def cursor_row(name: str, saved: Any) -> CursorRow:
    """One cursor as saved on the job's row, ``{"value": ..., "attempt": n, "saved_at": "..."}``:
    its value masked as the job's arguments are (all of it, under a name such as ``token``)."""
    if not isinstance(saved, dict):
        saved = {"value": saved}
    value = mask_value({name: saved.get("value")})[name]
    return CursorRow(
        name=mask_text(name),
        value=json.dumps(value, sort_keys=True, ensure_ascii=False),
        attempt=saved.get("attempt", "-"),
        saved_at=_saved_at(saved.get("saved_at")),
    )


def _saved_at(text: Any) -> str:
    """When a cursor was saved: the database's ``now()`` as JSON text, shown in the time zone of
    the other moments on the page (UTC, as the database connection gives them)."""
    if not isinstance(text, str):
        return "-"
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        return mask_text(text)
    if when.tzinfo is not None and settings.USE_TZ:
        when = when.astimezone(UTC)
    return timestamp(when)
