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

A transaction the job system opens itself (:func:`transaction` on an idle connection, or
:func:`atomic` outside any caller's ``atomic()``) sets the same settings once, at its start
(one statement), for the whole transaction: a tick, a run now, a resume, a schedule sync, a
queue's resume or limit, an operator's retry or cancel, an enqueue of several rows commits
durably like a claim does. Its statements then run as they are.

Inside a caller's transaction (``transaction.atomic()``, ``ATOMIC_REQUESTS``, autocommit turned
off) the statement still runs with the bounded waits, in the same single message: the caller's
own values are saved before, and put back after it, so the rest of the caller's transaction is
not changed behind its back. ``synchronous_commit`` is not touched there: the caller's commit,
and so its durability, stays the caller's. "Inside a caller's transaction" is read from Django's
own state (``in_atomic_block``) and the driver's autocommit, never from the server's transaction
status alone: Django sends its BEGIN only with the first statement of the block, so the first
statement of an ``atomic()`` finds the connection idle.
"""

from __future__ import annotations

import contextlib
import dataclasses
import weakref
from collections.abc import Iterator, Sequence
from typing import Any, TypeVar

import psycopg
from django.db import connections
from django.db import transaction as django_transaction

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


def check_columns(cursor: Cursor, row_type: type[Any]) -> None:
    """Raise :class:`ColumnMismatch` unless the statement's columns are ``row_type``'s fields, in
    order: for a hot statement read by position, checked once rather than on every row."""
    names = _columns(cursor, row_type)
    fields = list(getattr(row_type, "_fields", ()))
    if names != fields:
        raise ColumnMismatch(
            f"the statement's columns ({', '.join(names)}) are not in the order of the fields of"
            f" {row_type.__name__} ({', '.join(fields)})"
        )


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


#: The driver connections now inside a transaction that the job system opened itself and set
#: up (see :func:`transaction` and :func:`atomic`): their statements run as they are.
_OWNED: weakref.WeakSet[Any] = weakref.WeakSet()


def _owned(raw: Any) -> bool:
    return raw.connection in _OWNED


def _in_callers_transaction(cursor: Cursor, raw: Any) -> bool:
    """Whether ``cursor``'s statements run inside a transaction that the caller opened (and
    will commit or roll back); see the module's docstring."""
    connection = raw.connection
    if connection in _OWNED:
        return False
    wrapper = getattr(cursor, "db", None)  # Django's connection, behind a CursorWrapper
    if wrapper is not None and getattr(wrapper, "in_atomic_block", False):
        return True
    idle = connection.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    return not (connection.autocommit and idle)


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
    if _owned(raw):  # the transaction's settings are in place since its start
        sender.execute(sql, params)
    elif not _in_callers_transaction(cursor, raw):
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


@contextlib.contextmanager
def transaction(cursor: Cursor) -> Iterator[None]:
    """One transaction on ``cursor``'s connection (Django's or a worker's own), as a context
    manager: committed at its end, rolled back on an error. On an idle connection it is the job
    system's own, with bounded waits and a durable commit (see the module's docstring); inside a
    transaction already open, the caller's or the job system's, it is a savepoint of it."""
    raw = raw_cursor(cursor)
    connection = raw.connection
    if not _owned(raw) and not _in_callers_transaction(cursor, raw):
        with connection.transaction(), _owning(connection):
            _set_up(cursor, raw)
            yield
        return
    if connection.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
        # Inside a caller's atomic() that has sent nothing yet: open it now (the driver sends
        # the caller's BEGIN with this statement), so that what follows is a savepoint of the
        # caller's transaction, not a transaction of its own committed before the caller's.
        _client_side(cursor, raw).execute(_OPEN_CALLERS_TRANSACTION)
    with connection.transaction():
        yield


@contextlib.contextmanager
def atomic(alias: str) -> Iterator[None]:
    """``transaction.atomic(using=alias)`` for a transaction that the job system opens itself:
    outside any caller's transaction, its settings (bounded waits, a durable commit) are set once
    at its start; inside a caller's transaction it is only a savepoint, committed with the
    caller's."""
    wrapper = connections[alias]
    outer = not wrapper.in_atomic_block and wrapper.get_autocommit()
    with django_transaction.atomic(using=alias):
        if not outer:
            yield
            return
        with wrapper.cursor() as cursor:
            raw = raw_cursor(cursor)
            _set_up(cursor, raw)
        with _owning(raw.connection):
            yield


def commit_durably(alias: str) -> None:
    """Make the transaction open on Django's connection ``alias`` commit durably (see the
    module's docstring): for a transaction of the job system's that another layer opened, as the
    admin's page that saves one of its rows does. Outside a transaction it does nothing."""
    wrapper = connections[alias]
    if not wrapper.in_atomic_block and wrapper.get_autocommit():
        return  # each statement is its own transaction, and the job system's ones are durable
    with wrapper.cursor() as cursor:
        raw = raw_cursor(cursor)
        if not _owned(raw):
            _client_side(cursor, raw).execute(_DURABLE_COMMIT)


@contextlib.contextmanager
def _owning(connection: Any) -> Iterator[None]:
    _OWNED.add(connection)
    try:
        yield
    finally:
        _OWNED.discard(connection)


def _set_up(cursor: Cursor, raw: Any) -> None:
    """The settings of the job system's own transaction, local to it (its first round trip)."""
    _client_side(cursor, raw).execute(_settings_statement())


_OPEN_CALLERS_TRANSACTION = "SELECT 1"
_DURABLE_COMMIT = (
    "SELECT CASE WHEN current_setting('synchronous_commit') IN ('off', 'local')"
    " THEN set_config('synchronous_commit', 'on', true) END"
)


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
    a single implicit transaction. Inside a transaction already open they run one after the
    other, each as :func:`execute` runs it.
    """
    raw = raw_cursor(cursor)
    if _owned(raw) or _in_callers_transaction(cursor, raw):
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
