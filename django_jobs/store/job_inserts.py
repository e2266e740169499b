"""Writing new jobs: one row (``insert_job``, or ``insert_plain_job``), or many (``reserve_jobs``
then one ``COPY``, ``copy_jobs``); the statements of enqueue.sql that write job rows. The payload
checks, the options and the dependencies are :mod:`django_jobs.enqueue`'s."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any, NamedTuple

from django_jobs.cursor import Cursor
from django_jobs.store import db
from django_jobs.store.sql import query


class InsertedJob(NamedTuple):
    """What ``insert_job`` returns of the row it wrote (and enqueue_many of the rows it
    reserved): the values the database chose."""

    id: int
    state: str
    attempt: int
    run_after: datetime
    created_at: datetime
    finished_at: datetime | None
    parent_attempt: int | None
    notified: bool
    #: The job's deadline (expires_at; given, or expires_after from the database's clock).
    expires_at: datetime | None = None


class Reserved(NamedTuple):
    """What ``reserve_jobs`` returns: the ids and the shared values of a bulk enqueue's rows."""

    ids: list[int]
    run_after: datetime
    created_at: datetime
    finished_at: datetime | None
    notified: bool
    parent_attempt: int | None
    expires_at: datetime | None


def insert_job(cursor: Cursor, params: dict[str, Any]) -> InsertedJob | None:
    """Write one job (``insert_job``, or ``insert_plain_job`` when it has neither a unique key
    nor a parent); ``None`` when its unique key is held by an active job."""
    plain = params["unique_key"] is None and params["parent"] is None
    sender = db.execute(cursor, _INSERT_PLAIN if plain else _INSERT, params)
    # Read by position: the columns are checked against InsertedJob's fields once per statement
    # and process, not on every enqueue (db.fetch_one_as builds their descriptions each time).
    if plain not in _CHECKED:
        db.check_columns(sender, InsertedJob)
        _CHECKED.add(plain)
    row = sender.fetchone()
    return None if row is None else InsertedJob._make(row)


_INSERT, _INSERT_PLAIN = query("insert_job"), query("insert_plain_job")
#: Which of the two statements' columns have been checked (by ``plain``).
_CHECKED: set[bool] = set()


def reserve_jobs(cursor: Cursor, params: dict[str, Any]) -> Reserved:
    """The ids and shared values of a bulk enqueue's ``params["count"]`` rows (``reserve_jobs``)."""
    reserved = db.fetch_one_as(db.execute(cursor, query("reserve_jobs"), params), Reserved)
    if reserved is None:  # a SELECT of expressions: always one row
        raise RuntimeError("reserve_jobs returned no row")
    return reserved


def copy_jobs(
    cursor: Cursor, columns: Sequence[tuple[str, str]], rows: Iterable[tuple[Any, ...]]
) -> None:
    """Write a bulk enqueue's rows with one COPY (``copy_jobs``), in the transaction of
    :func:`reserve_jobs`: ``columns`` are (name, PostgreSQL type) pairs, each row their values."""
    statement = query("copy_jobs").format(columns=", ".join(name for name, _ in columns))
    with db.raw_cursor(cursor).copy(statement) as copy:
        copy.set_types([type_name for _, type_name in columns])
        for row in rows:
            copy.write_row(row)
