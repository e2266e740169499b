"""The supervisor's own PostgreSQL connection, kept apart from Django's thread-local ones.

It is built from the Django settings of ``JOBS_DATABASE`` (so OPTIONS such as sslmode or a
multi-host ``host`` apply), runs in autocommit mode, and is named after the worker id in
``pg_stat_activity.application_name``. Errors that leave the connection unusable close it; the
next use reconnects.
"""

from __future__ import annotations

import contextlib
import logging
import random
import time
from collections.abc import Iterator
from typing import Any

import psycopg
from django.db import connections

from django_jobs.db import LOCK_NOT_AVAILABLE, QUERY_CANCELED

logger = logging.getLogger("django_jobs.worker")

# SQLSTATE classes and codes after which the session cannot be trusted: connection exceptions,
# admin shutdown, and a read-only server (a failover left us on a standby).
_FATAL_SQLSTATE_PREFIXES = ("08", "57P")
_FATAL_SQLSTATES = {"25006"}


def is_connection_fatal(exc: BaseException) -> bool:
    sqlstate = getattr(exc, "sqlstate", None) or ""
    if sqlstate in (LOCK_NOT_AVAILABLE, QUERY_CANCELED):
        return False  # a bounded wait ran out: the statement failed, the session is fine
    if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
        return True
    sqlstate = getattr(exc, "sqlstate", None) or ""
    return sqlstate.startswith(_FATAL_SQLSTATE_PREFIXES) or sqlstate in _FATAL_SQLSTATES


#: The longest wait between two tries of a database that is away or failing: short, so that a
#: worker serves jobs within seconds of its database coming (back); a try costs little.
OUTAGE_RETRY_CAP = 5.0


def backoff(failures: int, cap: float = 30.0) -> float:
    """Seconds to wait after the ``failures``-th failure in a row: doubling from about half a
    second up to ``cap``, with jitter so that many workers do not retry in step."""
    return min(cap, 0.5 * 2 ** min(failures, 6)) * random.uniform(0.5, 1.0)


class Complaints:
    """How often a retry loop logs its failures: a new kind of failure at once, then the same
    kind at most once per ``interval``, saying how many went unlogged. A database that is away
    for an hour costs a line a minute, not one per try."""

    def __init__(self, interval: float = 60.0) -> None:
        self.interval = interval
        self.logged_at = float("-inf")
        self.kind: str | None = None
        self.unlogged = 0

    def due(self, exc: BaseException) -> int | None:
        """Whether to log ``exc``: ``None`` if not (it is counted), else how many failures since
        the last line were not logged."""
        now = time.monotonic()
        kind = f"{type(exc).__name__}: {str(exc).strip()[:200]}"
        if kind == self.kind and now - self.logged_at < self.interval:
            self.unlogged += 1
            return None
        self.logged_at, self.kind = now, kind
        unlogged, self.unlogged = self.unlogged, 0
        return unlogged

    def reset(self) -> None:
        """The loop succeeded: the next failure is news again."""
        self.logged_at = float("-inf")
        self.kind = None
        self.unlogged = 0


def connection_params(alias: str, application_name: str) -> dict[str, Any]:
    params = dict(connections[alias].get_connection_params())
    params["application_name"] = application_name[:63]
    params["autocommit"] = True
    return params


class QueueConnection:
    def __init__(self, alias: str, application_name: str) -> None:
        self.alias = alias
        self.application_name = application_name
        self._conn: psycopg.Connection[Any] | None = None
        self._cursor: psycopg.Cursor[Any] | None = None

    def _connect(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(**connection_params(self.alias, self.application_name))
        return self._conn

    @contextlib.contextmanager
    def cursor(self) -> Iterator[Any]:
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
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
            self._conn = None
            self._cursor = None
