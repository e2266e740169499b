"""Putting jobs in the table: single and bulk enqueue, with payload checks.

Enqueueing writes through Django's connection for ``JOBS_DATABASE``, so it joins the caller's
``transaction.atomic()``: a job enqueued in a transaction that rolls back never existed.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import DatabaseError, connections, transaction
from django.db.models.base import ModelState

from django_jobs import conf, workflows
from django_jobs.cursor import Cursor
from django_jobs.exceptions import DependencyError, InvalidOption, InvalidPayload
from django_jobs.models.job import Job
from django_jobs.registry import MAX_INT, registry
from django_jobs.runtime import tracing
from django_jobs.states import UNSUCCESSFUL_STATES, State
from django_jobs.storable import may_hold_unstorable, unstorable
from django_jobs.store import db, diagnosis, job_inserts
from django_jobs.store.sql import query

if TYPE_CHECKING:
    from django_jobs.tasks import Task

logger = logging.getLogger("django_jobs.enqueue")

_JSON_SCALARS = (str, int, float, bool, type(None))
_JSON = json.JSONEncoder(separators=(",", ":"))
# Exactly these types (not subclasses, which may encode differently) need no walk.
_FLAT_TYPES = frozenset((str, int, bool, type(None)))


#: How deeply job arguments may nest lists and objects.
MAX_DEPTH = 100


def _check_json(value: Any, path: str, depth: int = 0) -> Any:
    """Return ``value`` as plain JSON (tuples become lists), or raise naming the bad element."""
    if isinstance(value, _JSON_SCALARS):
        if isinstance(value, float) and not math.isfinite(value):
            raise InvalidPayload(f"{path} is {value!r}, which JSON cannot represent")
        if isinstance(value, str) and (why := unstorable(value)) is not None:
            raise InvalidPayload(f"{path} {why}")
        return value
    if depth >= MAX_DEPTH:
        where = path if len(path) <= 60 else f"{path[:60]}..."
        raise InvalidPayload(
            f"job arguments nest lists or objects more than {MAX_DEPTH} levels deep (at {where})"
        )
    if isinstance(value, list | tuple):
        return [_check_json(item, f"{path}[{i}]", depth + 1) for i, item in enumerate(value)]
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise InvalidPayload(f"{path} has a key {key!r}; JSON object keys must be strings")
            if (why := unstorable(key)) is not None:
                raise InvalidPayload(f"{path} has a key {key!r} that {why}")
            out[key] = _check_json(item, f"{path}[{key!r}]", depth + 1)
        return out
    raise InvalidPayload(
        f"{path} is a {type(value).__name__}, which is not JSON. Job arguments must be plain "
        "JSON (str, int, float, bool, None, list, dict): pass ids or strings, not objects."
    )


def checked_json(value: Any, path: str) -> Any:
    """``value`` as plain JSON (tuples become lists); raises :class:`InvalidPayload` naming the
    element, below ``path``, that is not (a step's result and a cursor's value are checked so)."""
    return _check_json(value, path)


def encode_json(value: Any) -> str:
    """Plain JSON ``value`` as compact JSON text; raises :class:`InvalidPayload` for what the
    encoder refuses (an int too long to write out, say)."""
    try:
        return _JSON.encode(value)
    except ValueError as exc:
        raise InvalidPayload(f"it cannot be written as JSON: {exc}") from None


def _encode(
    args: Sequence[Any], kwargs: Mapping[str, Any], limit: int | None = None
) -> tuple[str, str, list, dict]:
    """Check a call's arguments and return them as JSON text, and as the plain values that text
    decodes to; raise :class:`InvalidPayload` if they don't fit."""
    args_value, kwargs_value = list(args), dict(kwargs)
    # Flat arguments of exactly str, int, bool and None (the common case) are JSON as they are;
    # anything else is walked and checked element by element.
    flat = all(type(value) in _FLAT_TYPES for value in args_value) and (
        not kwargs_value
        or (
            all(type(value) in _FLAT_TYPES for value in kwargs_value.values())
            and all(type(key) is str for key in kwargs_value)
        )
    )
    if not flat:
        args_value = _check_json(args_value, "args")
        kwargs_value = _check_json(kwargs_value, "kwargs")
    try:
        args_json = _JSON.encode(args_value)
        kwargs_json = _JSON.encode(kwargs_value) if kwargs_value else "{}"
    except ValueError as exc:  # an int too long to write out, say
        raise InvalidPayload(f"job arguments cannot be written as JSON: {exc}") from None
    if flat and (may_hold_unstorable(args_json) or may_hold_unstorable(kwargs_json)):
        # A flat string may hold a NUL or a lone surrogate (the walk above checked the rest):
        # the walk names it.
        _check_json(args_value, "args")
        _check_json(kwargs_value, "kwargs")
    size = len(args_json) + len(kwargs_json)  # the encoder writes ASCII: characters are bytes
    limit = conf.max_payload_bytes() if limit is None else limit
    if size > limit:
        raise InvalidPayload(
            f"job arguments are {size} bytes of JSON, over JOBS_MAX_PAYLOAD_BYTES ({limit}). "
            "Store large data elsewhere and pass a reference."
        )
    return args_json, kwargs_json, args_value, kwargs_value


def _resolve_task(task: Task | str) -> Task:
    if not isinstance(task, str):
        # A Task object built by hand must still be the registered one.
        registered = registry.get(task.name)
        if registered.func is not task.func:
            raise InvalidOption(
                f"task {task.name!r} is not the function registered under that name"
            )
        return task
    return registry.get(task)


def _job_id(value: Any, what: str) -> int:
    if isinstance(value, Job):
        if value.pk is None:
            raise InvalidOption(f"{what} is an unsaved Job")
        return int(value.pk)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise InvalidOption(f"{what} must be a Job or a job id, not {value!r}")


def _run_after_params(run_after: datetime | timedelta | None) -> tuple[datetime | None, float]:
    if isinstance(run_after, timedelta):
        return None, run_after.total_seconds()
    return run_after, 0.0


def _check_parent(cursor: Cursor, parent_id: int | None) -> None:
    """Raise before anything is written if the parent does not exist (its foreign key is checked
    only at commit, after enqueue would have returned a job)."""
    if (
        parent_id is not None
        and db.execute(cursor, query("parent_exists"), {"parent": parent_id}).fetchone() is None
    ):
        raise InvalidOption(f"parent job #{parent_id} does not exist")


def _insert_dependencies(cursor: Cursor, job_ids: list[int], dependency_ids: list[int]) -> None:
    params = {"job_ids": job_ids, "dependency_ids": dependency_ids}
    db.execute(cursor, query("insert_dependencies"), params)


def _dependency_ids(task: Task) -> list[int]:
    return sorted({_job_id(dep, "depends_on") for dep in task.depends_on})


def missing_dependencies(missing: list[int]) -> DependencyError:
    """The error of a ``depends_on`` that names the jobs ``missing``, which do not exist (or, to
    a token of the HTTP API, that it may not see: it is told the same)."""
    return DependencyError(
        f"depends_on names jobs that do not exist: {missing}. A job can depend only on "
        "jobs that already exist (which also rules out cycles)."
    )


def _initial_state(cursor: Cursor, dependency_ids: list[int]) -> tuple[str, str]:
    """The state a new job starts in, given its dependencies; and the reason if cancelled."""
    if not dependency_ids:
        return State.PENDING.value, ""
    found = db.execute(cursor, query("read_dependencies"), {"ids": dependency_ids}).fetchall()
    missing = sorted(set(dependency_ids) - {row[0] for row in found})
    if missing:
        raise missing_dependencies(missing)
    for job_id, state, task in found:
        if state in UNSUCCESSFUL_STATES:
            return (
                State.CANCELLED.value,
                f"cancelled: upstream job #{job_id} ({task}) ended {state}",
            )
    if all(state == State.DONE for _, state, _ in found):
        return State.PENDING.value, ""
    return State.WAITING.value, ""


#: A bulk enqueue that writes at least this many dependency rows refreshes the planner's
#: statistics of the job and dependency tables once it has committed.
ANALYZE_AFTER = 10_000


def _analyze(alias: str) -> None:
    try:
        with connections[alias].cursor() as cursor:
            db.execute(cursor, query("analyze_jobs"))
    except DatabaseError as exc:  # the jobs are written; autovacuum analyzes soon enough
        logger.warning("could not analyze the job tables after a bulk enqueue: %s", exc)


def _settle_after_commit(alias: str, state: str, job_ids: list[int]) -> None:
    """Once the enqueue has committed, check new waiting jobs against their dependencies again
    (see read_dependencies in enqueue.sql); at once when there is no transaction to wait for."""
    if state != State.WAITING:
        return

    def settle() -> None:
        try:
            with connections[alias].cursor() as cursor:
                workflows.settle_new_dependents(cursor, job_ids)
        except DatabaseError as exc:
            # The jobs are written, and the enqueue must not fail after its commit: the
            # reaper's repair pass settles them if their dependencies ended meanwhile.
            message = "could not check %d new waiting job(s) against their dependencies: %s"
            logger.warning(message, len(job_ids), exc)

    transaction.on_commit(settle, using=alias)


#: The prefix of the concurrency key given to a job with a rate limit and no concurrency key:
#: the claim takes keyed jobs only on its longer way, which checks the key's rate window, and
#: never walks the jobs of a full window (see django_jobs_claim, version 9).
RATE_KEY_PREFIX = "rate:"


def _controls(task: Task) -> dict[str, Any]:
    """The columns of a job's limits: its concurrency key and limit, its rate key, limit and
    window, and its deadline (``expires_at``, or ``expires_after`` seconds from the database's
    ``now()``)."""
    concurrency = task.concurrency
    rate = task.rate
    if concurrency is None and rate is not None:
        concurrency = (RATE_KEY_PREFIX + rate[0], MAX_INT)
    expires_after = task.expires_after
    if isinstance(expires_after, timedelta):
        expires_after = expires_after.total_seconds()
    return {
        "concurrency_key": concurrency[0] if concurrency else None,
        "concurrency_limit": concurrency[1] if concurrency else None,
        "rate_key": rate[0] if rate else None,
        "rate_limit": rate[1].limit if rate else None,
        "rate_period": rate[1].period if rate else None,
        "expires_at": task.expires_at,
        "expires_after": None if expires_after is None else float(expires_after),
    }


def _check_deadline(cursor: Cursor, params: dict[str, Any]) -> None:
    """Refuse, before anything is written, a deadline that has passed by the database's clock."""
    if params["expires_at"] is None:
        return
    row = db.execute(cursor, query("deadline_passed"), {"expires_at": params["expires_at"]})
    if row.fetchone()[0]:
        raise InvalidOption(
            f"expires_at {params['expires_at'].isoformat()} has passed: a job with a deadline in"
            " the past would never run"
        )


def _params(task: Task, state: str, reason: str) -> dict[str, Any]:
    run_at, delay = _run_after_params(task.run_after)
    # The span this enqueue happens in (a request's, a running job's), which the job's runs
    # link to; None outside one, or without OpenTelemetry.
    trace_context = tracing.current_context()
    return {
        "task": task.name,
        "queue": task.queue,
        "priority": task.priority,
        "state": state,
        "max_attempts": task.effective_max_attempts,
        "timeout": task.effective_timeout,
        "run_at": run_at,
        "delay": delay,
        "parent": _job_id(task.parent, "parent") if task.parent is not None else None,
        "unique_key": task.unique_key,
        **_controls(task),
        "reason": reason,
        "trace_context": None if trace_context is None else _JSON.encode(trace_context),
    }


def job_values(task: Task | str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The parameters of ``insert_job`` (enqueue.sql) for one call of ``task`` without
    dependencies: exactly what :func:`enqueue` stores (the scheduler's enqueue, on a worker's
    own connection). Raises as :func:`enqueue` does for a bad task or arguments."""
    task = _resolve_task(task)
    if task.depends_on or task.parent is not None:
        raise InvalidOption("a job with dependencies or a parent goes through enqueue()")
    args_json, kwargs_json, _, _ = _encode(args, kwargs)
    return {**_params(task, State.PENDING.value, ""), "args": args_json, "kwargs": kwargs_json}


def _build(
    params: dict[str, Any],
    args: list[Any],
    kwargs: dict[str, Any],
    row: job_inserts.InsertedJob,
    alias: str,
) -> Job:
    """The :class:`Job` of the row just written, as a query would load it: the values given,
    those the database chose (``row``), and NULL in the columns written as NULL."""
    values = {
        **dict.fromkeys(_field_names()),
        "id": row.id,
        "task": params["task"],
        "queue": params["queue"],
        "priority": params["priority"],
        "state": row.state,
        "args": args,
        "kwargs": kwargs,
        "attempt": row.attempt,
        "max_attempts": params["max_attempts"],
        "timeout": params["timeout"],
        "run_after": row.run_after,
        "created_at": row.created_at,
        "finished_at": row.finished_at,
        "error": params["reason"],
        "cancel_requested": False,
        "parent_id": params["parent"],
        "parent_attempt": row.parent_attempt,
        "unique_key": params["unique_key"],
        "progress_message": "",
        "concurrency_key": params["concurrency_key"],
        "concurrency_limit": params["concurrency_limit"],
        "trace_context": None if (text := params["trace_context"]) is None else json.loads(text),
        "rate_key": params["rate_key"],
        "rate_limit": params["rate_limit"],
        "rate_period": params["rate_period"],
        "expires_at": row.expires_at,
    }
    # from_db: a loaded instance (not adding, on ``alias``), made by Model.__init__'s positional
    # path, a third of the cost of keyword arguments; post_init is sent as for any query.
    return Job.from_db(alias, _field_names(), list(values.values()))


@functools.cache
def _field_names() -> tuple[str, ...]:
    """The job table's columns, in the order of ``Job``'s fields (Model.__init__'s positional
    order)."""
    return tuple(field.attname for field in Job._meta.concrete_fields)


def _statements(alias: str, several: bool) -> Any:
    """Several statements run in one transaction (a savepoint inside the caller's); a single
    INSERT is atomic by itself and needs no BEGIN/COMMIT round trips."""
    return db.atomic(alias) if several else contextlib.nullcontext()


def enqueue(
    task: Task | str, args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None
) -> Job:
    """Enqueue one call of a registered task and return its :class:`Job`.

    With a ``unique_key`` that an active job already holds, that job is returned instead.
    With ``depends_on``, the job waits until those jobs are done, and is cancelled if one of
    them fails for good. Nothing is written if anything is wrong. Without the job tables (no
    ``manage.py migrate`` yet) it raises :class:`~django_jobs.exceptions.JobTablesMissing`, and
    with the database down :class:`~django_jobs.exceptions.DatabaseUnreachable`.
    """
    task = _resolve_task(task)
    args_json, kwargs_json, args_value, kwargs_value = _encode(args, kwargs or {})
    alias = conf.database_alias()
    dependency_ids = _dependency_ids(task)
    with (
        diagnosis.translated(alias),
        _statements(alias, bool(dependency_ids)),
        connections[alias].cursor() as cursor,
    ):
        params = _params(task, *_initial_state(cursor, dependency_ids))
        params.update(args=args_json, kwargs=kwargs_json)
        _check_parent(cursor, params["parent"])
        _check_deadline(cursor, params)
        while True:
            row = job_inserts.insert_job(cursor, params)
            if row is not None:
                if dependency_ids:
                    _insert_dependencies(cursor, [row.id], dependency_ids)
                    _settle_after_commit(alias, params["state"], [row.id])
                return _build(params, args_value, kwargs_value, row, alias)
            # The unique key is held by an active job: hand that one back. If it ended in the
            # meantime, the key is free again and the insert is retried.
            holder = {"unique_key": task.unique_key}
            existing = db.execute(cursor, query("find_active_unique"), holder).fetchone()
            if existing is not None:
                return Job.objects.using(alias).get(pk=existing[0])


def enqueue_many(
    task: Task | str, calls: Iterable[tuple[Sequence[Any], Mapping[str, Any]]]
) -> list[Job]:
    """Enqueue many calls of one task in one transaction, the rows written with ``COPY``.

    Every job gets the task's options, ``depends_on`` included. Returns the jobs in order.
    """
    task = _resolve_task(task)
    if task.unique_key is not None:
        raise InvalidOption("enqueue_many() cannot take a unique_key; enqueue such jobs one by one")
    limit = conf.max_payload_bytes()
    encoded = [_encode(args, kwargs, limit) for args, kwargs in calls]
    if not encoded:
        return []
    alias = conf.database_alias()
    dependency_ids = _dependency_ids(task)
    with (
        diagnosis.translated(alias),
        db.atomic(alias),
        connections[alias].cursor() as cursor,
    ):
        params = _params(task, *_initial_state(cursor, dependency_ids))
        _check_parent(cursor, params["parent"])
        _check_deadline(cursor, params)
        reserve = {**params, "count": len(encoded)}
        reserved = job_inserts.reserve_jobs(cursor, reserve)
        ids, run_after, created_at = reserved.ids, reserved.run_after, reserved.created_at
        finished_at, parent_attempt = reserved.finished_at, reserved.parent_attempt
        expires_at = reserved.expires_at
        # Rows differ only in id and arguments. The columns they share go in only where they
        # differ from the column's default (NULL, '', or now(), which is the same moment in
        # this transaction), which spares COPY their parsing.
        due_now = params["run_at"] is None and not params["delay"]
        shared = [
            (name, type_name, value)
            for name, type_name, value in (
                ("task", "text", params["task"]),
                ("queue", "text", params["queue"]),
                ("priority", "int2", params["priority"]),
                ("state", "text", params["state"]),
                ("max_attempts", "int4", params["max_attempts"]),
                ("created_at", "timestamptz", created_at),
                ("run_after", "timestamptz", None if due_now else run_after),
                ("timeout", "int4", params["timeout"]),
                ("finished_at", "timestamptz", finished_at),
                ("parent_id", "int8", params["parent"]),
                ("parent_attempt", "int4", parent_attempt),
                ("error", "text", params["reason"] or None),
                ("concurrency_key", "text", params["concurrency_key"]),
                ("concurrency_limit", "int4", params["concurrency_limit"]),
                ("trace_context", "text", params["trace_context"]),  # JSON text for jsonb
                ("rate_key", "text", params["rate_key"]),
                ("rate_limit", "int4", params["rate_limit"]),
                ("rate_period", "int4", params["rate_period"]),
                ("expires_at", "timestamptz", expires_at),
            )
            if value is not None
        ]
        columns = [("id", "int8"), ("args", "text"), ("kwargs", "text")]  # JSON text for jsonb
        columns += [(name, type_name) for name, type_name, _ in shared]
        values = tuple(value for _, _, value in shared)
        rows = (
            (job_id, args_json, kwargs_json, *values)
            for job_id, (args_json, kwargs_json, _, _) in zip(ids, encoded, strict=True)
        )
        job_inserts.copy_jobs(cursor, columns, rows)
        if dependency_ids:
            _insert_dependencies(cursor, ids, dependency_ids)
            _settle_after_commit(alias, params["state"], ids)
            if len(ids) * len(dependency_ids) >= ANALYZE_AFTER:
                transaction.on_commit(functools.partial(_analyze, alias), using=alias)
    row = job_inserts.InsertedJob(
        ids[0],
        params["state"],
        0,
        run_after,
        created_at,
        finished_at,
        parent_attempt,
        False,
        expires_at,
    )
    return _copies(_build(params, [], {}, row, alias), ids, encoded)


def _copies(template: Job, ids: Sequence[int], encoded: Sequence[tuple[Any, ...]]) -> list[Job]:
    # Job instances that differ from the template only in id and arguments, made without
    # Model.__init__ (a tenth of the cost): the template went through it, and these take its
    # field values. No post_init signal is sent for them.
    common = template.__dict__
    jobs = []
    for job_id, (_, _, args, kwargs) in zip(ids, encoded, strict=True):
        job = Job.__new__(Job)
        job.__dict__.update(common)
        job.id, job.args, job.kwargs = job_id, args, kwargs
        job._state = ModelState()
        job._state.adding = False
        job._state.db = template._state.db
        jobs.append(job)
    return jobs
