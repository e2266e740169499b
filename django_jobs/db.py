"""How the job system runs its own statements: with bounded lock and statement waits.

A statement that runs as its own transaction (the connection is idle, in autocommit) is sent
together with ``SET LOCAL lock_timeout`` and ``SET LOCAL statement_timeout`` (and ``jit = off``)
in one simple-query message, which PostgreSQL runs as a single implicit transaction: one round
trip, no session state left behind (so it works through pgbouncer in transaction-pooling mode),
and a claim or finish can never hang behind a stuck lock. Inside a caller's transaction the
statement runs as it is, so the caller's settings are not changed behind its back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg

from django_jobs import conf

#: The NOTIFY channel; a notification's payload is the name of the queue that has work.
CHANNEL = "django_jobs"

# SQLSTATEs of a bounded wait that ran out: try again later; never a reason to fail a job.
LOCK_NOT_AVAILABLE = "55P03"
QUERY_CANCELED = "57014"


def raw_cursor(cursor: Any) -> Any:
    """The driver's cursor behind ``cursor``."""
    # A Django CursorWrapper keeps the driver's cursor in .cursor; a psycopg cursor is itself.
    return getattr(cursor, "cursor", cursor)


def execute(cursor: Any, sql: str, params: Any = None, *, durable: bool = True) -> None:
    """Execute ``sql`` with bounded waits when it is its own transaction (see above).

    ``durable=False`` lets its commit return before the WAL reaches disk (``SET LOCAL
    synchronous_commit = off``), for a write whose loss in a server crash is harmless.
    """
    raw = raw_cursor(cursor)
    idle = raw.connection.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    if not (idle and isinstance(raw, psycopg.ClientCursor)):
        cursor.execute(sql, params)
        return
    cursor.execute("".join(f"{setting}; " for setting in _settings(durable)) + sql, params)
    while raw.nextset():  # step past the SETs to the statement's own result
        pass


def _settings(durable: bool) -> list[str]:
    settings = [
        f"SET LOCAL lock_timeout = {conf.lock_timeout_ms():d}",
        f"SET LOCAL statement_timeout = {conf.statement_timeout_ms():d}",
        # The job system's statements are short: compiling one costs more than it could save
        # (a misestimated reaper query once spent 250 ms of a 300 ms run compiling).
        "SET LOCAL jit = off",
    ]
    if not durable:
        settings.append("SET LOCAL synchronous_commit = off")
    return settings


def is_timeout(exc: BaseException) -> bool:
    """Whether ``exc`` (or the driver error behind a Django one) is a bounded wait running out."""
    for error in (exc, exc.__cause__):
        if getattr(error, "sqlstate", None) in (LOCK_NOT_AVAILABLE, QUERY_CANCELED):
            return True
    return False


def execute_together(
    cursor: Any, statements: Sequence[tuple[str, Any]], *, durable: bool = True
) -> list[list[Any]]:
    """Run several statements as one transaction in one round trip; return each one's rows.

    Like :func:`execute`, with bounded waits (and ``durable``), when the connection is idle and
    binds client-side (the statements are bound here and sent as one simple-query message, which
    PostgreSQL runs as a single implicit transaction). Otherwise they run one after the other.
    """
    raw = raw_cursor(cursor)
    idle = raw.connection.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    if not (idle and isinstance(raw, psycopg.ClientCursor)):
        results = []
        for sql, params in statements:
            cursor.execute(sql, params)
            results.append(cursor.fetchall())
        return results
    parts = [*_settings(durable), *(raw.mogrify(sql, params) for sql, params in statements)]
    cursor.execute("; ".join(parts))
    results = []
    while True:
        if raw.pgresult.status == psycopg.pq.ExecStatus.TUPLES_OK:  # not a SET's result
            results.append(raw.fetchall())
        if not raw.nextset():
            return results
