"""Queue controls: pause and resume a queue, and cap the running jobs of a queue or of a key.

- A **paused** queue is not claimed from. Its running jobs finish normally, enqueueing still
  works, and ``--burst`` workers treat it as empty. :func:`pause` and :func:`resume` write the
  queue's row in ``django_jobs_queue``; the claim function reads that row on every claim, so the
  change takes effect at the next claim, with no restart.
- A **queue limit** (``JOBS_QUEUE_LIMITS = {"gpu": 4}``, the admin, ``manage.py jobqueue
  limit``) caps the queue's running jobs across all workers.
- A **key limit** (``@job(concurrency_limit=1)``, ``.using(concurrency_key="import:42")``) caps
  the running jobs that share the key; see :attr:`django_jobs.tasks.Task.concurrency`.

Both limits are exact. A claim that might take a limited queue's slot holds that queue's
advisory lock (transaction-scoped: milliseconds, and fine through pgbouncer in transaction
mode) while it counts the queue's running jobs and claims; a claim of a job with a key holds the
key's lock the same way. The counts are of ``running`` rows, so a finish, a reap, a retry or a
crash frees a slot by ending the row's run, and nothing can leak a slot. Jobs over a limit wait
as ``pending`` without being claimed, and the claim never walks them: see ``django_jobs_claim``
in django_jobs/store/sql/functions/ (its newest version).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from django.db import connections

from django_jobs import conf
from django_jobs.cursor import Cursor
from django_jobs.exceptions import InvalidOption
from django_jobs.models.queue_control import Queue
from django_jobs.registry import MAX_INT, registry
from django_jobs.store import db
from django_jobs.store.sql import query

log = logging.getLogger("django_jobs.queues")


class UnknownQueue(InvalidOption):
    """A queue that no job, task, worker, setting or control names."""


@dataclasses.dataclass(frozen=True)
class QueueState:
    """What ``jobqueue list``, the dashboard and ``jobstats`` show of a queue."""

    name: str
    paused: bool
    paused_at: datetime | None
    paused_by: str
    pause_reason: str
    concurrency_limit: int | None
    limit_source: str
    pending: int
    running: int


def check_limit(value: Any, what: str = "limit") -> int | None:
    """``value`` as a limit (a whole number from 1 up, or ``None`` for no limit); raises
    :class:`InvalidOption` otherwise."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_INT:
        raise InvalidOption(
            f"{what} must be a whole number from 1 to {MAX_INT} (pause the queue to run none),"
            f" not {value!r}"
        )
    return value


def check_limits(value: Any) -> dict[str, int]:
    """``JOBS_QUEUE_LIMITS`` checked: a dict of queue name to limit."""
    if not isinstance(value, Mapping):
        raise InvalidOption(f"JOBS_QUEUE_LIMITS must be a dict like {{'gpu': 4}}, not {value!r}")
    limits: dict[str, int] = {}
    for name, limit in value.items():
        _check_name(name)
        checked = check_limit(limit, f"JOBS_QUEUE_LIMITS[{name!r}]")
        assert checked is not None
        limits[name] = checked
    return limits


def _check_name(name: Any) -> str:
    if not isinstance(name, str) or not name.strip() or len(name) > 100:
        raise InvalidOption(
            f"a queue name is a non-empty string of at most 100 characters, not {name!r}"
        )
    return name


def known(alias: str | None = None) -> set[str]:
    """The queues that exist as far as anything knows: the default queue, registered tasks'
    queues, ``JOBS_QUEUE_LIMITS``, queue controls, live workers' queues and unfinished jobs'."""
    alias = alias or conf.database_alias()
    names = {*registry.queues()}
    limits = conf.queue_limits()
    if isinstance(limits, Mapping):
        names.update(limits)
    with connections[alias].cursor() as cursor:
        rows = db.execute(cursor, query("known_queues")).fetchall()
    names.update(name for (name,) in rows if name)
    return names


def _require_known(name: Any, alias: str) -> str:
    name = _check_name(name)
    if name not in known(alias):
        raise UnknownQueue(
            f"unknown queue {name!r}: no job, task, worker, JOBS_QUEUE_LIMITS entry or earlier"
            " control names it (manage.py jobqueue list shows the known ones)"
        )
    return name


def pause(name: str, by: str = "", reason: str = "", alias: str | None = None) -> None:
    """Stop claims from queue ``name`` until :func:`resume`. Running jobs finish normally."""
    alias = alias or conf.database_alias()
    name = _require_known(name, alias)
    if not isinstance(reason, str) or len(reason) > 1000:
        raise InvalidOption("a pause reason is a string of at most 1000 characters")
    with connections[alias].cursor() as cursor:
        db.execute(
            cursor, query("pause_queue"), {"name": name, "by": by[:150], "reason": reason.strip()}
        )
    log.warning("queue %s paused by %s%s", name, by or "?", f": {reason}" if reason else "")


def resume(name: str, alias: str | None = None) -> None:
    """Claim from queue ``name`` again, and wake idle workers to do so."""
    alias = alias or conf.database_alias()
    name = _require_known(name, alias)
    with db.atomic(alias), connections[alias].cursor() as cursor:
        db.execute(cursor, query("resume_queue"), {"name": name})
    log.warning("queue %s resumed", name)


def set_limit(
    name: str,
    limit: int | None,
    source: str = Queue.LimitSource.ADMIN,
    alias: str | None = None,
) -> None:
    """Cap queue ``name``'s running jobs at ``limit`` across all workers (``None``: no cap).
    From the admin or ``jobqueue`` (the default), the limit wins over ``JOBS_QUEUE_LIMITS``
    until it is set back with ``source="settings"``."""
    alias = alias or conf.database_alias()
    name = _require_known(name, alias)
    limit = check_limit(limit)
    if source == Queue.LimitSource.SETTINGS:
        limit = check_limits(conf.queue_limits()).get(name)
    with db.atomic(alias), connections[alias].cursor() as cursor:
        db.execute(
            cursor,
            query("set_queue_limit"),
            {"name": name, "limit": limit, "source": source},
        )


def sync_limits(cursor: Cursor | None = None) -> None:
    """Write ``JOBS_QUEUE_LIMITS`` into the queue table (a worker does this when it starts), in
    one statement: limits set from settings follow them; limits set in the admin or by
    ``jobqueue`` stay. An invalid setting (``manage.py check`` reports it) is logged and left
    out."""
    try:
        limits = check_limits(conf.queue_limits())
    except InvalidOption as error:
        log.error("JOBS_QUEUE_LIMITS not synced: %s", error)
        return
    params = {"names": list(limits), "limits": list(limits.values())}
    if cursor is None:
        with connections[conf.database_alias()].cursor() as own:
            db.execute(own, query("sync_queue_limits"), params)
    else:
        db.execute(cursor, query("sync_queue_limits"), params)


def states(alias: str | None = None) -> list[QueueState]:
    """Every known queue with its controls and its pending and running counts, by name."""
    alias = alias or conf.database_alias()
    names = sorted(known(alias))
    with connections[alias].cursor() as cursor:
        rows = db.execute(cursor, query("queue_states"), {"names": names}).fetchall()
    return [QueueState(*row) for row in rows]
