"""Waking idle workers at once: one LISTEN connection per worker process.

Enqueueing sends ``NOTIFY django_jobs, '<queue>'`` inside the enqueueing transaction, so it is
delivered only on commit. The supervisor waits on this connection's socket together with its
executors' pipes; a notification for a queue it serves makes it claim right away. If the LISTEN
connection fails, the worker falls back to polling and reconnects with backoff: a notification
is only ever a hint, and polling finds every job anyway.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from typing import Any

import psycopg

from django_jobs import conf, db
from django_jobs.worker.backoff import OUTAGE_RETRY_CAP, Backoff, first_line, unlogged_note
from django_jobs.worker.connection import connection_params

logger = logging.getLogger("django_jobs.worker")


class Wakeup:
    def __init__(self, alias: str, application_name: str, queues: Sequence[str]) -> None:
        self.alias = alias
        self.application_name = application_name
        self.queues = set(queues)
        self.conn: psycopg.Connection[Any] | None = None
        self.backoff = Backoff(OUTAGE_RETRY_CAP)

    def _connect(self) -> None:
        url = conf.listen_database_url()
        if url:
            conn = psycopg.connect(url, autocommit=True, application_name=self.application_name)
        else:
            conn = psycopg.connect(**connection_params(self.alias, self.application_name))
        conn.execute(f"LISTEN {db.CHANNEL}")
        self.conn = conn

    def ensure(self) -> None:
        """(Re)connect if down and due; never raises."""
        if self.conn is not None or self.backoff.waiting():
            return
        try:
            self._connect()
        except Exception as exc:
            self._failed(exc)
            return
        if self.backoff.succeeded():
            logger.info("LISTEN connection is back; waking on notifications again")

    def fileno(self) -> int | None:
        return self.conn.pgconn.socket if self.conn is not None else None

    def drain(self) -> bool:
        """Read pending notifications; True if one is for a queue this worker serves."""
        if self.conn is None:
            return False
        relevant = False
        try:
            pgconn = self.conn.pgconn
            pgconn.consume_input()
            while (note := pgconn.notifies()) is not None:
                queue = note.extra.decode(errors="replace")
                if not self.queues or queue in self.queues:
                    relevant = True
            if pgconn.status != psycopg.pq.ConnStatus.OK:
                raise psycopg.OperationalError("LISTEN connection closed")
        except Exception as exc:
            self._failed(exc)
            return True  # a notification may have been lost: look for work
        return relevant

    def _failed(self, exc: BaseException) -> None:
        self.close()
        delay = self.backoff.failed()
        unlogged = self.backoff.complaints.due(exc)
        if unlogged is not None:
            logger.warning(
                "LISTEN connection unavailable (%s); polling, reconnecting in %.1fs%s",
                first_line(exc) or type(exc).__name__,
                delay,
                unlogged_note(unlogged),
            )

    def close(self) -> None:
        if self.conn is not None:
            with contextlib.suppress(Exception):
                self.conn.close()
            self.conn = None
