"""How the job system runs its own statements: bounded waits, durable commits, one round trip.

A statement that runs as its own transaction (the connection is idle, in autocommit) is sent
together with one ``SELECT set_config(...)`` in a single simple-query message, which PostgreSQL
runs as a single implicit transaction: one round trip, no session state left behind (so it works
through pgbouncer in transaction-pooling mode). The settings are local to that transaction:

- ``lock_timeout`` and ``statement_timeout``: a claim or finish never hangs behind a stuck lock;
- ``jit = off``: compiling one of these short statements costs more than it could save;
- ``synchronous_commit``: raised to ``on`` where the server, database or role has it ``off`` or
  ``local``. A claim or finish that the worker was told had committed must survive a server
  crash or a failover to a synchronous standby: a lost claim would let a second executor run a
  job that is still running, and a lost finish would rerun or fail a job that had ended.
  ``remote_write`` and ``remote_apply`` are left as the operator set them.

The statements are bound client-side here even when Django's connection binds server-side
(``OPTIONS["server_side_binding"]``): a server-side binding cursor cannot send several statements
in one message, and would lose the settings and the single transaction.

Inside a caller's transaction (``transaction.atomic()``, ``ATOMIC_REQUESTS``) the statement still
runs with the bounded waits, in the same single message: the caller's own values are saved
before, and put back after it, so the rest of the caller's transaction is not changed behind its
back. Its commit, and so its durability, stays the caller's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, TypeVar

import psycopg

from django_jobs import conf
from django_jobs.cursor import Cursor

#: The NOTIFY channel; a notification's payload is the name of the queue that has work.
CHANNEL = "django_jobs"

# SQLSTATEs of a bounded wait that ran out: try again later; never a reason to fail a job.
LOCK_NOT_AVAILABLE = "55P03"
QUERY_CANCELED = "57014"


def raw_cursor(cursor: Cursor) -> Any:
    """The driver's cursor behind ``cursor``."""
    # A Django CursorWrapper keeps the driver's cursor in .cursor; a psycopg cursor is itself.
    return getattr(cursor, "cursor", cursor)


Row = TypeVar("Row")


class ColumnMismatch(TypeError):
    """A statement's columns are not the fields of the row type it is read into."""


def fetch_one_as(cursor: Cursor, row_type: type[Row]) -> Row | None:
    """The next row of ``cursor`` as a ``row_type`` (a NamedTuple or a dataclass whose fields
    are named as the statement's columns), or None when there is none."""
    names = _columns(cursor, row_type)
    row = cursor.fetchone()
    return None if row is None else row_type(**dict(zip(names, row, strict=True)))


def fetch_all_as(cursor: Cursor, row_type: type[Row]) -> list[Row]:
    """The remaining rows of ``cursor``, each as a ``row_type`` (see :func:`fetch_one_as`)."""
    names = _columns(cursor, row_type)
    return [row_type(**dict(zip(names, row, strict=True))) for row in cursor.fetchall()]


def _columns(cursor: Cursor, row_type: type[Any]) -> list[str]:
    """The names of the statement's columns, checked against ``row_type``'s fields: a renamed
    column fails here, with both lists, rather than as a value read into the wrong field."""
    description = cursor.description
    if description is None:
        raise ColumnMismatch(f"the statement read into {row_type.__name__} returns no rows")
    names = [column[0] for column in description]
    if dataclasses.is_dataclass(row_type):
        fields = [field.name for field in dataclasses.fields(row_type) if field.init]
    else:
        fields = list(getattr(row_type, "_fields", ()))
    if sorted(names) != sorted(fields):
        raise ColumnMismatch(
            f"the statement's columns ({', '.join(names)}) are not the fields of"
            f" {row_type.__name__} ({', '.join(fields)}): name each column as its field"
        )
    return names


def _own_transaction(raw: Any) -> bool:
    return bool(raw.connection.info.transaction_status == psycopg.pq.TransactionStatus.IDLE)


def _client_side(cursor: Cursor, raw: Any) -> Any:
    """``cursor`` if it binds client-side, else a client-side cursor on the same connection."""
    if isinstance(raw, psycopg.ClientCursor):
        return cursor
    return psycopg.ClientCursor(raw.connection)


def execute(cursor: Cursor, sql: str, params: Any = None) -> Any:
    """Execute ``sql`` with bounded waits (and a durable commit, when it is its own transaction;
    see above); return the cursor that holds its rows (``cursor``, or one on its connection)."""
    raw = raw_cursor(cursor)
    sender = _client_side(cursor, raw)
    if _own_transaction(raw):
        sender.execute(_settings_statement() + "; " + sql, params)
        raw_cursor(sender).nextset()  # step past the settings to the statement's own result
    else:
        sender.execute(f"{_SAVE}; {_bounded_waits()}; {sql}; {_RESTORE}", params)
        raw_cursor(sender).nextset()
        raw_cursor(sender).nextset()
    return sender


def _settings_statement() -> str:
    return (
        _bounded_waits() + ", CASE WHEN current_setting('synchronous_commit') IN ('off', 'local')"
        " THEN set_config('synchronous_commit', 'on', true) END"
    )


def _bounded_waits() -> str:
    return (
        "SELECT "
        f"set_config('lock_timeout', '{conf.lock_timeout_ms():d}', true), "
        f"set_config('statement_timeout', '{conf.statement_timeout_ms():d}', true), "
        "set_config('jit', 'off', true)"
    )


# Inside a caller's transaction: its own values, kept in placeholder settings of this
# transaction while a statement of the job system runs, and put back after it.
_SAVED = ("lock_timeout", "statement_timeout", "jit")
_SAVE = "SELECT " + ", ".join(
    f"set_config('django_jobs.saved_{name}', current_setting('{name}'), true)" for name in _SAVED
)
_RESTORE = "SELECT " + ", ".join(
    f"set_config('{name}', current_setting('django_jobs.saved_{name}'), true)" for name in _SAVED
)


def transaction(cursor: Cursor) -> Any:
    """One transaction on ``cursor``'s connection (Django's or a worker's own), as a context
    manager: committed at its end, rolled back on an error; a savepoint inside a transaction
    already open."""
    return raw_cursor(cursor).connection.transaction()


def is_timeout(exc: BaseException) -> bool:
    """Whether ``exc`` (or the driver error behind a Django one) is a bounded wait running out."""
    for error in (exc, exc.__cause__):
        if getattr(error, "sqlstate", None) in (LOCK_NOT_AVAILABLE, QUERY_CANCELED):
            return True
    return False


def execute_together(cursor: Cursor, statements: Sequence[tuple[str, Any]]) -> list[list[Any]]:
    """Run several statements as one transaction in one round trip; return each one's rows.

        Like :func:`execute`, with bounded waits and a durable commit, when the connection is idle:
        the statements are bound here and sent as one simple-query message, which PostgreSQL runs as
        a single implicit transaction. Inside a caller's transaction they run one after the other,
    each as :func:`execute` runs it.
    """
    raw = raw_cursor(cursor)
    if not _own_transaction(raw):
        return [execute(cursor, sql, params).fetchall() for sql, params in statements]
    sender = _client_side(cursor, raw)
    driver = raw_cursor(sender)
    parts = [_settings_statement(), *(driver.mogrify(sql, params) for sql, params in statements)]
    sender.execute("; ".join(parts))
    results = []
    while driver.nextset():  # the first result is the settings'
        results.append(driver.fetchall() if driver.pgresult.status == _TUPLES_OK else [])
    return results


_TUPLES_OK = psycopg.pq.ExecStatus.TUPLES_OK
