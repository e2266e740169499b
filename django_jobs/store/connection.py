"""The supervisor's own PostgreSQL connection, kept apart from Django's thread-local ones.

It is built from the Django settings of ``JOBS_DATABASE`` (so OPTIONS such as sslmode or a
multi-host ``host`` apply), runs in autocommit mode, and is named after the worker id in
``pg_stat_activity.application_name``. Errors that leave the connection unusable close it; the
next use reconnects.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
from django.db import connections

from django_jobs.exceptions import ApiUnreachable
from django_jobs.store.db import LOCK_NOT_AVAILABLE, QUERY_CANCELED

logger = logging.getLogger("django_jobs.worker")

# SQLSTATE classes and codes after which the session cannot be trusted: connection exceptions,
# admin shutdown, and a read-only server (a failover left us on a standby).
_FATAL_SQLSTATE_PREFIXES = ("08", "57P")
_FATAL_SQLSTATES = {"25006"}


def is_connection_fatal(exc: BaseException) -> bool:
    sqlstate = getattr(exc, "sqlstate", None) or ""
    if sqlstate in (LOCK_NOT_AVAILABLE, QUERY_CANCELED):
        return False  # a bounded wait ran out: the statement failed, the session is fine
    if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError | ApiUnreachable):
        return True  # ApiUnreachable: a worker of the HTTP API lost its server
    sqlstate = getattr(exc, "sqlstate", None) or ""
    return sqlstate.startswith(_FATAL_SQLSTATE_PREFIXES) or sqlstate in _FATAL_SQLSTATES


def connection_params(alias: str, application_name: str) -> dict[str, Any]:
    params = dict(connections[alias].get_connection_params())
    params["application_name"] = application_name[:63]
    params["autocommit"] = True
    return params


class QueueConnection:
    """The one connection of a worker's queue work. ``on_connect`` is called with each
    connection it opens (a benchmark traces the protocol from there)."""

    def __init__(
        self,
        alias: str,
        application_name: str,
        on_connect: Callable[[psycopg.Connection[Any]], None] | None = None,
    ) -> None:
        self.alias = alias
        self.application_name = application_name
        self.on_connect = on_connect
        self._conn: psycopg.Connection[Any] | None = None
        self._cursor: psycopg.Cursor[Any] | None = None
        self._lock = threading.RLock()

    def _connect(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(**connection_params(self.alias, self.application_name))
            if self.on_connect is not None:
                self.on_connect(self._conn)
        return self._conn

    @contextlib.contextmanager
    def cursor(self) -> Iterator[Any]:
        # The worker makes a job's finish on a thread of its own (worker/round_trip.py), and
        # waits for it before any other use; the lock makes sure of it.
        with self._lock:
            yield from self._cursor_unlocked()

    def _cursor_unlocked(self) -> Iterator[Any]:
        conn = self._connect()
        # One cursor serves every statement on a connection: making one per job costs CPU on
        # the supervisor's serial path.
        if self._cursor is None or self._cursor.connection is not conn:
            self._cursor = conn.cursor()
        try:
            yield self._cursor
        except BaseException as exc:
            if is_connection_fatal(exc):
                self.close()
            elif (
                not conn.closed
                and conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE
            ):
                conn.rollback()
            raise

    @property
    def broken(self) -> bool:
        """Whether the last error closed the connection (an outage, not a failed statement)."""
        return self._conn is None or self._conn.closed

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                with contextlib.suppress(Exception):
                    self._conn.close()
                self._conn = None
                self._cursor = None
