"""Firing periodic jobs: each due tick enqueues exactly once, however many schedulers run.

A scheduler (a step of every worker's loop, or ``manage.py runjobscheduler``) asks
:func:`next_due` between ticks: one small statement on the partial index ``schedule_due_idx``.
When a schedule is due, :func:`fire_due` handles it in one short transaction on the scheduler's
connection: lock the schedule row (``FOR UPDATE SKIP LOCKED``: other schedulers pass over it),
insert the tick (its unique ``(schedule, fire_at)`` decides, should two get this far), insert
the job with ``insert_job``, the statement of ``Task.enqueue`` (same options, checks and
wake-up), and advance ``next_run_at`` in the same transaction, so that other schedulers then
find nothing due. Work is in proportion to the due schedules, not to the schedulers.

Which tick runs after a downtime is :func:`django_jobs.schedules.cron.plan`'s decision. With
``overlap="skip"`` the job holds the unique key ``schedule:<name>`` while it is active, and a
tick meanwhile is recorded ``skipped: previous run active``. While the job's queue is paused, a
tick is recorded ``skipped: queue paused`` and enqueues nothing, unless the schedule says
``when_queue_paused="enqueue"``. The clock is the database's.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Mapping
from datetime import datetime
from typing import Any, NamedTuple

from django.db import connections

from django_jobs import conf, enqueue
from django_jobs.cursor import Cursor
from django_jobs.exceptions import JobsError
from django_jobs.schedules import cron
from django_jobs.schedules.declarations import FIELDS, job_task
from django_jobs.store import db, job_inserts
from django_jobs.store.sql import query

logger = logging.getLogger("django_jobs.schedules")

ENQUEUED, OVERLAP, RUN_NOW = "enqueued", "skipped: previous run active", "run now"
QUEUE_PAUSED = "skipped: queue paused"

#: The fields an operator edits in the admin (:func:`edit`): those code declares, and the name.
EDITABLE = ("name", *FIELDS)

#: Schedules one pass handles at most, so that a worker's loop stays responsive.
PASS_LIMIT = 100


class Due(NamedTuple):
    """A locked schedule row (``lock_due_schedule``), with the database's clock."""

    id: int
    name: str
    task: str
    cron: str
    timezone: str
    args: Any
    kwargs: Any
    queue: str
    priority: int | None
    catch_up: str
    overlap: str
    when_queue_paused: str
    next_run_at: datetime | None
    paused: bool
    now: datetime


@dataclasses.dataclass
class FirePass:
    """What one pass of a scheduler did."""

    #: Jobs enqueued, and schedules handled (a tick run, skipped or refused).
    fired: int = 0
    handled: int = 0
    #: Seconds until the next schedule is due (0 or less: due now); None when none is active.
    seconds_until_due: float | None = None
    #: ``name: outcome`` of each schedule handled, for the scheduler's log.
    outcomes: list[str] = dataclasses.field(default_factory=list)


def next_due(cursor: Cursor, tasks: list[str]) -> float | None:
    """Seconds until the earliest schedule of one of ``tasks`` is due; None if there is none."""
    seconds: float | None = db.execute(cursor, query("next_due"), {"tasks": tasks}).fetchone()[0]
    return seconds


def fire_due(cursor: Cursor, tasks: list[str], grace: float | None = None) -> FirePass:
    """Handle every due schedule of ``tasks`` that no other scheduler is handling, each in its
    own transaction; then say when the next is due. When none is due, that is one statement.
    ``cursor`` must be in autocommit."""
    grace = conf.schedule_grace() if grace is None else grace
    done = FirePass(seconds_until_due=next_due(cursor, tasks))
    if done.seconds_until_due is None or done.seconds_until_due > 0:
        return done  # nothing due: this one statement was the whole pass
    while done.handled < PASS_LIMIT:
        with db.transaction(cursor):
            row = db.fetch_one_as(
                db.execute(cursor, query("lock_due_schedule"), {"tasks": tasks}), Due
            )
            if row is None:
                break
            due = _due(row)
            job_id, outcome = _handle(cursor, due, grace)
        done.handled += 1
        done.fired += job_id is not None
        done.outcomes.append(f"{due.name}: {outcome}")
    done.seconds_until_due = 0.0 if done.handled >= PASS_LIMIT else next_due(cursor, tasks)
    return done


def _handle(cursor: Cursor, due: Due, grace: float) -> tuple[int | None, str]:
    """Run (or skip) the due tick of a locked schedule, and advance it."""
    assert due.next_run_at is not None
    try:
        plan = cron.plan(due.cron, due.timezone, due.next_run_at, due.now, due.catch_up, grace)
    except JobsError as exc:  # edited into the table by hand: stop it, and say why
        outcome = f"not run: {exc}"
        _record(cursor, due, None, None, None, None, outcome)
        logger.error("schedule %s: %s", due.name, outcome)
        return None, outcome
    note = plan.skipped_note()
    if plan.fire_at is None:
        _record(cursor, due, plan.next_run_at, None, None, None, note)
        return None, note
    tick_id, job_id, outcome = fire(cursor, due, plan.fire_at, ENQUEUED)
    if tick_id is None:  # another scheduler's: its outcome stays the schedule's last
        _record(cursor, due, plan.next_run_at, None, None, None, None)
        return None, outcome
    last = f"{outcome} ({note})" if note else outcome
    _record(cursor, due, plan.next_run_at, plan.fire_at, tick_id, job_id, last, outcome)
    return job_id, last


def fire(
    cursor: Cursor, due: Due, fire_at: datetime, label: str
) -> tuple[int | None, int | None, str]:
    """Claim the tick ``fire_at`` and enqueue its job: (tick id, job id, outcome). No tick id
    if a scheduler handled this tick already; no job id if the previous run is still active
    (``overlap="skip"``), if the job's queue is paused (a tick of the schedule's times, with
    ``when_queue_paused="skip"``; run now enqueues all the same), or if the job could not be
    made (the outcome says why)."""
    tick = db.execute(
        cursor, query("insert_tick"), {"id": due.id, "fire_at": fire_at, "outcome": label}
    ).fetchone()
    if tick is None:
        return None, None, "already handled by another scheduler"
    try:
        task = job_task(due.task, due.queue, due.priority, due.overlap, due.name)
        values = enqueue.job_values(task, due.args, due.kwargs)
    except JobsError as exc:
        logger.error("schedule %s: no job enqueued: %s", due.name, exc)
        return tick[0], None, f"not enqueued: {exc}"
    if label == ENQUEUED and due.when_queue_paused == cron.QUEUE_PAUSED_SKIP:
        paused = db.execute(cursor, query("queue_is_paused"), {"name": values["queue"]})
        if paused.fetchone()[0]:
            return tick[0], None, QUEUE_PAUSED
    inserted = job_inserts.insert_job(cursor, values)
    if inserted is None:
        return tick[0], None, OVERLAP
    return tick[0], inserted.id, label


def _record(
    cursor: Cursor,
    due: Due,
    next_run_at: datetime | None,
    fire_at: datetime | None,
    tick_id: int | None,
    job_id: int | None,
    last_outcome: str | None,
    tick_outcome: str = "",
) -> None:
    params = {
        "id": due.id,
        "next_run_at": next_run_at,
        "fire_at": fire_at,
        "tick_id": tick_id,
        "job_id": job_id,
        "outcome": tick_outcome[:100],
        "last_outcome": last_outcome,
    }
    db.execute(cursor, query("record_tick"), params)


# ---------------------------------------------------------------------- operators' actions


def _due(due: Due) -> Due:
    # Django's connection hands jsonb over as text (JSONField decodes it); psycopg's, decoded.
    if isinstance(due.args, str) or isinstance(due.kwargs, str):
        due = due._replace(args=_json(due.args), kwargs=_json(due.kwargs))
    return due


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def _locked(cursor: Cursor, schedule_id: int) -> Due:
    row = db.fetch_one_as(db.execute(cursor, query("lock_schedule"), {"id": schedule_id}), Due)
    if row is None:
        raise JobsError(f"no schedule has id {schedule_id}")
    return _due(row)


# The operators' actions on one schedule, by id: Schedule.pause(), resume(), run_now() and
# recompute_next_run() call these, then read the row again.


def run_now(schedule_id: int) -> int:
    """Enqueue one job of the schedule now, through the tick's path, recorded as a tick "run
    now"; return its id (with ``overlap="skip"`` and a run still active: that run's job). Its
    next tick stays as it was. Raises :class:`JobsError` if no job can be made."""
    alias = conf.database_alias()
    with connections[alias].cursor() as cursor, db.transaction(cursor):
        due = _locked(cursor, schedule_id)
        tick_id, job_id, outcome = fire(cursor, due, due.now, RUN_NOW)
        if outcome.startswith("not enqueued"):
            raise JobsError(f"schedule {due.name!r}: {outcome}")
        if job_id is None:
            key = {"unique_key": f"schedule:{due.name}"}
            held = db.execute(cursor, query("find_active_unique"), key).fetchone()
            job_id = held[0] if held else None
        _record(cursor, due, due.next_run_at, due.now, tick_id, job_id, outcome, outcome)
    if job_id is None:
        raise JobsError(f"schedule {due.name!r}: {outcome}")
    return job_id


def pause(schedule_id: int, by: str) -> None:
    """Stop the schedule firing (kept across syncs) until :func:`resume`."""
    _set_paused(schedule_id, True, by)


def resume(schedule_id: int) -> None:
    """Fire the schedule again from its next tick after now: ticks missed meanwhile are not
    run. One transaction, under the row's lock: a scheduler sees the schedule either paused or
    resumed with its next tick after now, never resumed with a tick that passed while it was
    paused."""
    alias = conf.database_alias()
    with connections[alias].cursor() as cursor, db.transaction(cursor):
        due = _locked(cursor, schedule_id)
        if not due.paused:  # nothing to resume: a tick due now stays due
            return
        next_run_at = cron.next_fire(due.cron, due.timezone, due.now)
        db.execute(
            cursor, query("resume_schedule"), {"id": schedule_id, "next_run_at": next_run_at}
        )


def edit(schedule_id: int, changes: Mapping[str, Any]) -> None:
    """An operator's edit: set the fields of ``changes`` (of :data:`EDITABLE`) and nothing
    else, in one statement under the row's lock, so that a pause, a run or a tick written since
    the edit began stays. The next tick moves only when the cron expression or the time zone
    changed, to the first tick after now of the new ones, and not even then while a tick is due
    and not yet fired: that one still fires. The values are checked by the caller (the admin's
    form runs :func:`~django_jobs.schedules.declarations.validate_schedule`); an invalid new
    expression or zone raises :class:`~django_jobs.exceptions.InvalidOption` here all the same,
    and changes nothing."""
    unknown = sorted(set(changes) - set(EDITABLE))
    if unknown:
        raise JobsError(f"cannot edit {', '.join(unknown)}: editable are {', '.join(EDITABLE)}")
    params: dict[str, Any] = {"id": schedule_id, "next_run_at": None}
    for field in EDITABLE:
        value = changes.get(field)
        params[f"set_{field}"] = field in changes
        params[field] = json.dumps(value) if field in ("args", "kwargs") else value
    alias = conf.database_alias()
    with connections[alias].cursor() as cursor, db.transaction(cursor):
        due = _locked(cursor, schedule_id)
        if {"cron", "timezone"} & set(changes):
            expression = changes.get("cron", due.cron)
            timezone = changes.get("timezone", due.timezone)
            upcoming = cron.next_fire(expression, timezone, due.now)
            waiting = due.next_run_at is not None and due.next_run_at <= due.now
            params["next_run_at"] = None if waiting else upcoming
        db.execute(cursor, query("edit_schedule"), params)


def _set_paused(schedule_id: int, paused: bool, by: str) -> None:
    # One statement that sets the pause's fields only: next_run_at and the run history stay.
    alias = conf.database_alias()
    with connections[alias].cursor() as cursor:
        params = {"id": schedule_id, "paused": paused, "by": by[:150]}
        db.execute(cursor, query("set_paused"), params)


def recompute_next_run(schedule_id: int) -> None:
    """Set ``next_run_at`` to the first tick after now of the schedule's (edited) expression
    and time zone. Raises :class:`~django_jobs.exceptions.InvalidOption` if they are invalid."""
    alias = conf.database_alias()
    with connections[alias].cursor() as cursor, db.transaction(cursor):
        due = _locked(cursor, schedule_id)
        next_run_at = cron.next_fire(due.cron, due.timezone, due.now)
        params = {"id": due.id, "next_run_at": next_run_at, "last_outcome": None}
        db.execute(cursor, query("set_next_run"), params)
