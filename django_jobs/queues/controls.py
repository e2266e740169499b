"""Queue controls: pause and resume a queue, and cap the running jobs of a queue or of a key.

- A **paused** queue is not claimed from. Its running jobs finish normally, enqueueing still
  works, and ``--burst`` workers treat it as empty. :func:`pause` and :func:`resume` write the
  queue's row in ``django_jobs_queue``; the claim function reads that row on every claim, so the
  change takes effect at the next claim, with no restart.
- A **queue limit** (``JOBS_QUEUE_LIMITS = {"gpu": 4}``, the admin, ``manage.py jobqueue
  limit``) caps the queue's running jobs across all workers.
- A **rate limit** (``JOBS_QUEUE_RATE_LIMITS = {"emails": "100/m"}``, the admin, :func:`set_rate`)
  lets at most that many of the queue's jobs start in any window of that length; a task's or a
  key's rate limit (``@job(rate_limit="10/s")``, ``.using(rate_key=...)``) does the same for
  its jobs. See ``django_jobs_rate_room`` in django_jobs/store/sql/functions/.
- A **fair** queue (``JOBS_FAIR_QUEUES``) is claimed round-robin across its keys.
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
from django_jobs.rates import Rate, parse_rate
from django_jobs.registry import MAX_INT, registry
from django_jobs.storable import unstorable
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


def check_rates(value: Any) -> dict[str, Rate]:
    """``JOBS_QUEUE_RATE_LIMITS`` checked: a dict of queue name to rate."""
    if not isinstance(value, Mapping):
        raise InvalidOption(
            f"JOBS_QUEUE_RATE_LIMITS must be a dict like {{'emails': '100/m'}}, not {value!r}"
        )
    return {
        _check_name(name): parse_rate(rate, f"JOBS_QUEUE_RATE_LIMITS[{name!r}]")
        for name, rate in value.items()
    }


def check_fair(value: Any) -> list[str]:
    """``JOBS_FAIR_QUEUES`` checked: a list of queue names."""
    if not isinstance(value, list):
        raise InvalidOption(f"JOBS_FAIR_QUEUES must be a list like ['imports'], not {value!r}")
    return [_check_name(name) for name in value]


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
    for setting in (conf.queue_limits(), conf.queue_rate_limits()):
        if isinstance(setting, Mapping):
            names.update(name for name in setting if isinstance(name, str))
    fair = conf.fair_queues()
    if isinstance(fair, list):
        names.update(name for name in fair if isinstance(name, str))
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
    if why := unstorable(reason):
        raise InvalidOption(f"the pause reason {why}")
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


def set_rate(
    name: str,
    rate: str | Rate | None,
    source: str = Queue.LimitSource.ADMIN,
    alias: str | None = None,
) -> None:
    """Let at most ``rate`` (``"100/m"``) of queue ``name``'s jobs start in any window of its
    length, across all workers (``None``: no rate limit). From the admin or ``jobqueue`` (the
    default), it wins over ``JOBS_QUEUE_RATE_LIMITS`` until set back with
    ``source="settings"``."""
    alias = alias or conf.database_alias()
    name = _require_known(name, alias)
    checked = None if rate is None else parse_rate(rate)
    if source == Queue.LimitSource.SETTINGS:
        checked = check_rates(conf.queue_rate_limits()).get(name)
    params = {
        "name": name,
        "limit": None if checked is None else checked.limit,
        "period": None if checked is None else checked.period,
        "source": source if checked is not None or source == Queue.LimitSource.ADMIN else "",
    }
    with db.atomic(alias), connections[alias].cursor() as cursor:
        db.execute(cursor, query("set_queue_rate"), params)


def sync_limits(cursor: Cursor | None = None) -> None:
    """Write ``JOBS_QUEUE_LIMITS``, ``JOBS_QUEUE_RATE_LIMITS`` and ``JOBS_FAIR_QUEUES`` into the
    queue table (a worker does this when it starts), a statement each: limits and rates set from
    settings follow them; those set in the admin or by ``jobqueue`` stay. An invalid setting
    (``manage.py check`` reports it) is logged and left out."""
    if cursor is None:
        with connections[conf.database_alias()].cursor() as own:
            _sync(own)
    else:
        _sync(cursor)


def _sync(cursor: Cursor) -> None:
    try:
        limits = check_limits(conf.queue_limits())
    except InvalidOption as error:
        log.error("JOBS_QUEUE_LIMITS not synced: %s", error)
    else:
        params = {"names": list(limits), "limits": list(limits.values())}
        db.execute(cursor, query("sync_queue_limits"), params)
    try:
        rates = check_rates(conf.queue_rate_limits())
        fair = check_fair(conf.fair_queues())
    except InvalidOption as error:
        log.error("JOBS_QUEUE_RATE_LIMITS and JOBS_FAIR_QUEUES not synced: %s", error)
        return
    params = {
        "names": list(rates),
        "limits": [rate.limit for rate in rates.values()],
        "periods": [rate.period for rate in rates.values()],
        "fair": fair,
    }
    db.execute(cursor, query("sync_queue_rates"), params)


def states(alias: str | None = None) -> list[QueueState]:
    """Every known queue with its controls and its pending and running counts, by name."""
    alias = alias or conf.database_alias()
    names = sorted(known(alias))
    with connections[alias].cursor() as cursor:
        rows = db.execute(cursor, query("queue_states"), {"names": names}).fetchall()
    return [QueueState(*row) for row in rows]
