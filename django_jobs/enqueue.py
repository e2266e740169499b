"""Putting jobs in the table: single and bulk enqueue, with payload checks.

Enqueueing writes through Django's connection for ``JOBS_DATABASE``, so it joins the caller's
``transaction.atomic()``: a job enqueued in a transaction that rolls back never existed.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.db import connections

from django_jobs import conf
from django_jobs.exceptions import InvalidOption, InvalidPayload
from django_jobs.models import Job
from django_jobs.registry import Task, registry
from django_jobs.states import ACTIVE_STATES, State, sql_in

_JSON_SCALARS = (str, int, float, bool, type(None))


def _check_json(value: Any, path: str) -> Any:
    """Return ``value`` as plain JSON (tuples become lists), or raise naming the bad element."""
    if isinstance(value, _JSON_SCALARS):
        if isinstance(value, float) and not math.isfinite(value):
            raise InvalidPayload(f"{path} is {value!r}, which JSON cannot represent")
        return value
    if isinstance(value, list | tuple):
        return [_check_json(item, f"{path}[{i}]") for i, item in enumerate(value)]
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise InvalidPayload(f"{path} has a key {key!r}; JSON object keys must be strings")
            out[key] = _check_json(item, f"{path}[{key!r}]")
        return out
    raise InvalidPayload(
        f"{path} is a {type(value).__name__}, which is not JSON. Job arguments must be plain "
        "JSON (str, int, float, bool, None, list, dict): pass ids or strings, not objects."
    )


def encode_payload(args: Sequence[Any], kwargs: Mapping[str, Any]) -> tuple[str, str]:
    """Check and encode a call's arguments; raise :class:`InvalidPayload` if they don't fit."""
    args_json = json.dumps(_check_json(list(args), "args"), separators=(",", ":"))
    kwargs_json = json.dumps(_check_json(dict(kwargs), "kwargs"), separators=(",", ":"))
    size = len(args_json.encode()) + len(kwargs_json.encode())
    limit = conf.max_payload_bytes()
    if size > limit:
        raise InvalidPayload(
            f"job arguments are {size} bytes of JSON, over JOBS_MAX_PAYLOAD_BYTES ({limit}). "
            "Store large data elsewhere and pass a reference."
        )
    return args_json, kwargs_json


def _resolve_task(task: Task | str) -> Task:
    if isinstance(task, Task):
        # A Task object built by hand must still be the registered one.
        registered = registry.get(task.name)
        if registered.func is not task.func:
            raise InvalidOption(
                f"task {task.name!r} is not the function registered under that name"
            )
        return task
    return registry.get(task)


def _refuse_unsupported(task: Task) -> None:
    if task.depends_on:
        raise InvalidOption("depends_on is not supported by this version of django-jobs")


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


# Columns written on enqueue; everything else comes from the columns' database defaults.
_COLUMNS = (
    "task, queue, priority, state, args, kwargs, max_attempts, timeout, run_after, parent_id,"
    " unique_key"
)
_RETURNING = "id, state, attempt, run_after, created_at"

# run_after is a given timestamp or the database clock plus a delay, never an app clock.
# now() is the transaction's clock, which the claim compares run_after with.
_INSERT_ONE = f"""
INSERT INTO django_jobs_job ({_COLUMNS})
VALUES (%s, %s, %s, %s, %s::jsonb, %s::jsonb, %s, %s,
        COALESCE(%s::timestamptz, now() + make_interval(secs => %s)), %s, %s)
ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL AND state IN {sql_in(ACTIVE_STATES)}
DO NOTHING
RETURNING {_RETURNING}
"""

_INSERT_MANY = f"""
INSERT INTO django_jobs_job ({_COLUMNS})
SELECT t, q, p, s, a::jsonb, k::jsonb, m, tm,
       COALESCE(ra, now() + make_interval(secs => rd)), par, NULL
FROM unnest(%s::text[], %s::text[], %s::int[], %s::text[], %s::text[], %s::text[], %s::int[],
            %s::int[], %s::timestamptz[], %s::float8[], %s::bigint[])
     WITH ORDINALITY AS u(t, q, p, s, a, k, m, tm, ra, rd, par, n)
ORDER BY n
RETURNING {_RETURNING}
"""

_FIND_ACTIVE_UNIQUE = f"""
SELECT id FROM django_jobs_job
WHERE unique_key = %s AND state IN {sql_in(ACTIVE_STATES)}
"""


def _build(task: Task, args_json: str, kwargs_json: str, row: Sequence[Any], alias: str) -> Job:
    job_id, state, attempt, run_after, created_at = row
    job = Job(
        id=job_id,
        task=task.name,
        queue=task.queue,
        priority=task.priority,
        state=state,
        args=json.loads(args_json),
        kwargs=json.loads(kwargs_json),
        attempt=attempt,
        max_attempts=task.effective_max_attempts,
        timeout=task.effective_timeout,
        run_after=run_after,
        created_at=created_at,
        error="",
        cancel_requested=False,
        parent_id=_job_id(task.parent, "parent") if task.parent is not None else None,
        unique_key=task.unique_key,
    )
    job._state.adding = False
    job._state.db = alias
    return job


def enqueue(
    task: Task | str, args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None
) -> Job:
    """Enqueue one call of a registered task and return its :class:`Job`.

    With a ``unique_key`` that an active job already holds, that job is returned instead.
    """
    task = _resolve_task(task)
    _refuse_unsupported(task)
    args_json, kwargs_json = encode_payload(args, kwargs or {})
    alias = conf.database_alias()
    run_at, delay = _run_after_params(task.run_after)
    parent_id = _job_id(task.parent, "parent") if task.parent is not None else None
    with connections[alias].cursor() as cursor:
        while True:
            cursor.execute(
                _INSERT_ONE,
                [
                    task.name,
                    task.queue,
                    task.priority,
                    State.PENDING,
                    args_json,
                    kwargs_json,
                    task.effective_max_attempts,
                    task.effective_timeout,
                    run_at,
                    delay,
                    parent_id,
                    task.unique_key,
                ],
            )
            row = cursor.fetchone()
            if row is not None:
                return _build(task, args_json, kwargs_json, row, alias)
            # The unique key is held by an active job: hand that one back. If it ended in the
            # meantime, the key is free again and the insert is retried.
            cursor.execute(_FIND_ACTIVE_UNIQUE, [task.unique_key])
            existing = cursor.fetchone()
            if existing is not None:
                return Job.objects.using(alias).get(pk=existing[0])


def enqueue_many(
    task: Task | str, calls: Iterable[tuple[Sequence[Any], Mapping[str, Any]]]
) -> list[Job]:
    """Enqueue many calls of one task with a single ``INSERT ... SELECT FROM unnest(...)``."""
    task = _resolve_task(task)
    _refuse_unsupported(task)
    if task.unique_key is not None:
        raise InvalidOption("enqueue_many() cannot take a unique_key; enqueue such jobs one by one")
    encoded = [encode_payload(args, kwargs) for args, kwargs in calls]
    if not encoded:
        return []
    alias = conf.database_alias()
    n = len(encoded)
    run_at, delay = _run_after_params(task.run_after)
    parent_id = _job_id(task.parent, "parent") if task.parent is not None else None
    params = [
        [task.name] * n,
        [task.queue] * n,
        [task.priority] * n,
        [State.PENDING.value] * n,
        [a for a, _ in encoded],
        [k for _, k in encoded],
        [task.effective_max_attempts] * n,
        [task.effective_timeout] * n,
        [run_at] * n,
        [delay] * n,
        [parent_id] * n,
    ]
    with connections[alias].cursor() as cursor:
        cursor.execute(_INSERT_MANY, params)
        rows = cursor.fetchall()
    return [_build(task, a, k, row, alias) for (a, k), row in zip(encoded, rows, strict=True)]
