"""Periodic jobs declared in code, and their sync into the schedules table.

A schedule is declared with ``@job(schedule="0 3 * * *")`` (named after its task) or in the
``JOBS_SCHEDULES`` setting. :func:`declared` reads both and checks each with
:func:`validate_schedule` (the admin's form calls it too); :func:`sync` writes them into
``django_jobs_schedule`` when a scheduler starts (and in ``manage.py syncschedules``): code wins
for the fields code declares, pausing stays, a code schedule no longer declared is marked
``missing_from_code_since`` and stops firing, and schedules made in the admin are never
touched. An invalid declaration is reported and left out of the sync, never half-written.

Firing the ticks is :mod:`django_jobs.schedules.ticks`.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import psycopg

from django_jobs import conf, enqueue
from django_jobs.cursor import Cursor
from django_jobs.exceptions import InvalidOption, JobsError
from django_jobs.registry import registry
from django_jobs.schedules import cron
from django_jobs.store import db
from django_jobs.store.sql import query

#: The keys a JOBS_SCHEDULES entry may have.
KEYS = {
    "task",
    "cron",
    "args",
    "kwargs",
    "timezone",
    "queue",
    "priority",
    "catch_up",
    "overlap",
    "when_queue_paused",
}
#: The fields code declares, which a sync writes.
FIELDS = (
    "task",
    "cron",
    "timezone",
    "args",
    "kwargs",
    "queue",
    "priority",
    "catch_up",
    "overlap",
    "when_queue_paused",
)


@dataclasses.dataclass(frozen=True)
class Declaration:
    """One schedule as code declares it."""

    name: str
    task: str
    cron: str
    timezone: str = "UTC"
    args: list[Any] = dataclasses.field(default_factory=list)
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    queue: str = ""
    priority: int | None = None
    catch_up: str = "skip"  # cron.CATCH_UP_SKIP (the field "cron" hides the module here)
    overlap: str = "allow"  # cron.OVERLAP_ALLOW
    when_queue_paused: str = "skip"  # cron.QUEUE_PAUSED_SKIP

    def values(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in FIELDS)


def validate_schedule(
    task: str,
    cron_expression: str,
    timezone: str = "UTC",
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    queue: str = "",
    priority: int | None = None,
    catch_up: str = cron.CATCH_UP_SKIP,
    overlap: str = cron.OVERLAP_ALLOW,
    when_queue_paused: str = cron.QUEUE_PAUSED_SKIP,
    name: str = "",
) -> None:
    """Raise :class:`InvalidOption` with a clear message if a schedule cannot run: an invalid
    cron expression, an unknown time zone, a task not registered, arguments that are not
    JSON, or an option out of range."""
    where = f"schedule {name!r}: " if name else ""
    try:
        if not isinstance(name, str) or len(name) > 200:
            raise InvalidOption("a schedule's name is a string of at most 200 characters")
        cron.expand(cron_expression)
        cron.zone(timezone)
        if catch_up not in (cron.CATCH_UP_SKIP, cron.CATCH_UP_LATEST):
            raise InvalidOption(f"catch_up must be 'skip' or 'latest', not {catch_up!r}")
        if overlap not in (cron.OVERLAP_ALLOW, cron.OVERLAP_SKIP):
            raise InvalidOption(f"overlap must be 'allow' or 'skip', not {overlap!r}")
        if when_queue_paused not in (cron.QUEUE_PAUSED_SKIP, cron.QUEUE_PAUSED_ENQUEUE):
            raise InvalidOption(
                f"when_queue_paused must be 'skip' or 'enqueue', not {when_queue_paused!r}"
            )
        if not isinstance(args, list | tuple):
            raise InvalidOption(f"args must be a list, not {type(args).__name__}")
        if kwargs is not None and not isinstance(kwargs, dict):
            raise InvalidOption(f"kwargs must be a dict, not {type(kwargs).__name__}")
        if not isinstance(task, str) or task not in registry:
            raise InvalidOption(
                f"task {task!r} is not registered: no @job function has that name in this "
                "process (define it in an installed app's jobs.py)"
            )
        enqueue.job_values(job_task(task, queue, priority, overlap, name), args, kwargs or {})
    except JobsError as exc:
        raise InvalidOption(f"{where}{exc}") from None


def job_task(task: str, queue: str, priority: int | None, overlap: str, name: str) -> Any:
    """The registered task with a schedule's options: its queue and priority when set, and
    the unique key ``schedule:<name>`` when runs may not overlap."""
    options: dict[str, Any] = {}
    if queue:
        options["queue"] = queue
    if priority is not None:
        options["priority"] = priority
    if overlap == cron.OVERLAP_SKIP:
        options["unique_key"] = f"schedule:{name}"
    return registry.get(task).using(**options)


def declared() -> tuple[list[Declaration], dict[str, str]]:
    """The schedules code declares, valid ones first; then the invalid ones' names, each with
    what is wrong."""
    found: dict[str, Declaration] = {}
    errors: dict[str, str] = {}
    for task in registry.all():
        if task.schedule is not None:
            found[task.name] = Declaration(name=task.name, task=task.name, cron=task.schedule)
    setting = conf.schedules()
    if not isinstance(setting, dict):
        return list(found.values()), {"JOBS_SCHEDULES": "must be a dict of schedules by name"}
    for name, spec in setting.items():
        try:
            found[name] = _from_setting(name, spec)
        except InvalidOption as exc:
            errors[str(name)] = str(exc)
    valid = []
    for declaration in found.values():
        try:
            validate_schedule(
                declaration.task,
                declaration.cron,
                declaration.timezone,
                declaration.args,
                declaration.kwargs,
                queue=declaration.queue,
                priority=declaration.priority,
                catch_up=declaration.catch_up,
                overlap=declaration.overlap,
                when_queue_paused=declaration.when_queue_paused,
                name=declaration.name,
            )
        except InvalidOption as exc:
            errors[declaration.name] = str(exc)
        else:
            valid.append(declaration)
    return valid, errors


def _from_setting(name: Any, spec: Any) -> Declaration:
    where = f"JOBS_SCHEDULES[{name!r}]"
    if not isinstance(name, str) or not name:
        raise InvalidOption(f"{where}: a schedule's name must be a non-empty string")
    if not isinstance(spec, dict):
        raise InvalidOption(f"{where} must be a dict with at least 'task' and 'cron'")
    unknown = set(spec) - KEYS
    missing = {"task", "cron"} - set(spec)
    if unknown or missing:
        raise InvalidOption(
            f"{where}: "
            + "; ".join(
                part
                for part in (
                    f"unknown keys {sorted(unknown)}" if unknown else "",
                    f"missing {sorted(missing)}" if missing else "",
                )
                if part
            )
            + f" (keys: {', '.join(sorted(KEYS))})"
        )
    args, kwargs = spec.get("args", []), spec.get("kwargs", {})
    return Declaration(
        name=name,
        task=spec["task"],
        cron=spec["cron"],
        timezone=spec.get("timezone", "UTC"),
        args=list(args) if isinstance(args, list | tuple) else args,
        kwargs=kwargs,
        queue=spec.get("queue", "") or "",
        priority=spec.get("priority"),
        catch_up=spec.get("catch_up", cron.CATCH_UP_SKIP),
        overlap=spec.get("overlap", cron.OVERLAP_ALLOW),
        when_queue_paused=spec.get("when_queue_paused", cron.QUEUE_PAUSED_SKIP),
    )


@dataclasses.dataclass
class SyncReport:
    """What a sync did (or, with ``dry_run``, would do), by schedule name."""

    added: list[str] = dataclasses.field(default_factory=list)
    changed: list[str] = dataclasses.field(default_factory=list)
    removed: list[str] = dataclasses.field(default_factory=list)
    #: Declared names taken by a schedule made in the admin (left as it is).
    conflicts: list[str] = dataclasses.field(default_factory=list)
    #: Invalid declarations, left out: name -> what is wrong.
    errors: dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def in_sync(self) -> bool:
        return not (self.added or self.changed or self.removed)

    def lines(self) -> list[str]:
        lines = [f"{verb} {name}" for verb, names in self._groups() for name in names]
        lines += [f"not synced (an admin schedule has the name): {n}" for n in self.conflicts]
        return lines + [f"invalid, not synced: {why}" for why in self.errors.values()]

    def _groups(self) -> list[tuple[str, list[str]]]:
        return [("added", self.added), ("changed", self.changed), ("marked removed", self.removed)]

    def summary(self) -> str:
        counts = ", ".join(f"{len(names)} {verb}" for verb, names in self._groups())
        return counts + (f", {len(self.errors)} invalid" if self.errors else "")


def sync(cursor: Cursor, *, dry_run: bool = False) -> SyncReport:
    """Write the schedules code declares into the table, in one transaction (with
    ``dry_run``, roll it back): see the module's docstring."""
    declarations, errors = declared()
    report = SyncReport(errors=errors)
    try:
        with db.transaction(cursor):
            _sync(cursor, declarations, report)
            if dry_run:
                raise psycopg.Rollback()
    except psycopg.Rollback:  # a savepoint's rollback inside a caller's transaction
        pass
    return report


class _SyncLock(NamedTuple):
    locked: None
    now: datetime.datetime


class _Stored(NamedTuple):
    """A schedule's row, as a sync reads it."""

    id: int
    name: str
    source: str
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
    missing_from_code_since: datetime.datetime | None

    def values(self) -> tuple[Any, ...]:
        """Its values in the order of :meth:`Declaration.values`."""
        values = self._replace(
            # Django's connection hands jsonb over as text; a worker's psycopg one, decoded.
            args=json.loads(self.args) if isinstance(self.args, str) else self.args,
            kwargs=json.loads(self.kwargs) if isinstance(self.kwargs, str) else self.kwargs,
        )
        return tuple(getattr(values, name) for name in FIELDS)


def _sync(cursor: Cursor, declarations: list[Declaration], report: SyncReport) -> None:
    lock = db.fetch_one_as(db.execute(cursor, query("sync_lock")), _SyncLock)
    assert lock is not None  # a SELECT without FROM has one row
    now = lock.now
    existing = {
        row.name: row
        for row in db.fetch_all_as(db.execute(cursor, query("read_schedules")), _Stored)
    }
    for declaration in declarations:
        row = existing.get(declaration.name)
        params = _params(declaration)
        if row is None:
            params["next_run_at"] = cron.next_fire(declaration.cron, declaration.timezone, now)
            db.execute(cursor, query("insert_schedule"), params)
            report.added.append(declaration.name)
            continue
        if row.source != "code":
            report.conflicts.append(row.name)
            continue
        moved = (row.cron, row.timezone) != (declaration.cron, declaration.timezone)
        missing = row.missing_from_code_since is not None
        if row.values() != declaration.values() or missing:
            if moved or missing:
                params["next_run_at"] = cron.next_fire(declaration.cron, declaration.timezone, now)
            db.execute(cursor, query("update_schedule"), params)
            report.changed.append(row.name)
    declared_names = {d.name for d in declarations} | set(report.errors)
    gone = [
        name
        for name, row in existing.items()
        if row.source == "code"
        and row.missing_from_code_since is None
        and name not in declared_names
    ]
    if gone:
        db.execute(cursor, query("mark_missing"), {"names": gone})
        report.removed.extend(gone)


def _params(declaration: Declaration) -> dict[str, Any]:
    params = dataclasses.asdict(declaration)
    params["args"] = json.dumps(declaration.args)
    params["kwargs"] = json.dumps(declaration.kwargs)
    params["next_run_at"] = None
    return params
