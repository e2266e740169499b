"""Waking idle workers at once, and only as many as the new work needs.

Enqueueing sends ``NOTIFY django_jobs, '<queue>'`` inside the enqueueing transaction, so it is
delivered only on commit, to every worker process: each keeps one LISTEN connection, and the
supervisor waits on its socket together with its executors' pipes.

If every idle worker claimed on every notification, one job would cost as many claims as there
are idle workers (a thundering herd: 11 claims a job with 10 idle workers). So the idle workers
that serve the same queues elect one of them, the *listener*, and only it claims on
notifications; the others wait in line for its place.

The election is a session advisory lock on the LISTEN connection, keyed by a hash of the
worker's sorted queue set (so that workers with other queue sets elect their own listener and
are all woken for their queues). The key is a 64-bit hash of ``django_jobs.listener:<queues>``,
in the one-bigint key space, like the transaction locks of django_jobs/queues/controls.py.

- A worker with a free slot that is not the listener waits in line for the lock
  (``wait_to_listen`` in django_jobs/store/sql/wakeup.sql, sent without waiting for its reply, so
  that the loop goes on; PostgreSQL grants the waiters in order). It does not claim on
  notifications.
- The listener claims on notifications for its queues, and polls every poll interval.
- When its slots are all busy, or it stops, the listener hands over: it notifies on the
  ``django_jobs_listener`` channel whether ready jobs are left (a bulk enqueue sends one
  notification for all its jobs, which the listener has used up), then unlocks. The first
  worker in line gets the lock, reads the notifications that reached it while it waited, and
  claims at once if the last hand-over said jobs are left, or if a notification for its queues
  came after it. Notifications before it were the last listener's to answer. With no hand-over
  heard (a worker just connected) it claims at once too. A listener that dies hands nothing
  over: the jobs notified while it listened make its successor claim; a scheduled job it would
  have polled for waits for its successor's poll.
  So a burst is spread over as many idle workers as it needs, one hand-over (a few
  milliseconds) each, and one job enqueued alone costs two claims: the listener's, and the
  finish-and-claim of the worker that ran it (see writes.py).
- A worker killed while listening loses its connection, and with it the lock: the next in line
  takes over within milliseconds. One that hangs with its connection open keeps the lock; the
  workers in line still poll, every ``FOLLOWER_POLL_FACTOR`` poll intervals, so no job waits
  forever.

Waiting in a statement holds a snapshot, which would stop vacuum from cleaning any table for as
long as it waits. So a wait lasts at most 2 seconds (caught in PL/pgSQL, so that it is not
logged as an error), and then the worker queues again. No transaction stays open between
statements, and nothing of this is on the queue connection, which may go through a
transaction-pooling pgbouncer: the LISTEN connection already goes to the server directly
(``JOBS_LISTEN_DATABASE_URL``).

If the LISTEN connection fails, the worker falls back to polling every poll interval and
reconnects with backoff: a notification is only ever a hint, and polling finds every job anyway.
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import logging
import select
from collections.abc import Sequence
from typing import Any

import psycopg

from django_jobs import conf
from django_jobs.runtime.backoff import OUTAGE_RETRY_CAP, Backoff, first_line, unlogged_note
from django_jobs.store import db
from django_jobs.store.connection import connection_params
from django_jobs.store.sql import query

logger = logging.getLogger("django_jobs.worker")

#: The channel on which a listener hands over its place: ``<key>:<1 if jobs are left, else 0>``.
HANDOVER_CHANNEL = "django_jobs_listener"

#: A worker in line polls this many times less often than the listener: only a listener that
#: hangs with its connection open leaves jobs to this poll.
FOLLOWER_POLL_FACTOR = 10


def listener_key(queues: Sequence[str]) -> int:
    """The advisory lock key of the listener of ``queues`` (all queues if empty): a signed
    64-bit hash of ``django_jobs.listener:`` and the sorted queue names."""
    names = ",".join(sorted(set(queues))) if queues else "*"
    digest = hashlib.blake2b(f"django_jobs.listener:{names}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


class Role(enum.Enum):
    DOWN = "down"  # no LISTEN connection: poll
    IDLE = "idle"  # connected, not in line (no free slot)
    WAITING = "waiting"  # in line for the listener's place
    LISTENING = "listening"  # the listener of its queue set


class Wakeup:
    """One worker's LISTEN connection and its place in the election of its queue set."""

    def __init__(self, alias: str, application_name: str, queues: Sequence[str]) -> None:
        self.alias = alias
        self.application_name = application_name
        self.queues = set(queues)
        self.key = listener_key(queues)
        self.conn: psycopg.Connection[Any] | None = None
        self.role = Role.DOWN
        # Notifications read but not yet acted on, in the order the server sent them.
        self.heard: list[psycopg.Notify] = []
        # What the last hand-over of this queue set's listener said (None: none heard on this
        # connection), and whether a notification for this worker's queues came after it.
        self.jobs_left: bool | None = None
        self.work_since_handover = False
        self.backoff = Backoff(OUTAGE_RETRY_CAP)

    @property
    def listening(self) -> bool:
        """Whether this worker is its queue set's listener: it claims on notifications."""
        return self.role is Role.LISTENING

    @property
    def following(self) -> bool:
        """Whether another worker listens for this one (so it may poll less often)."""
        return self.role in (Role.IDLE, Role.WAITING)

    def _connect(self) -> None:
        url = conf.listen_database_url()
        if url:
            conn = psycopg.connect(url, autocommit=True, application_name=self.application_name)
        else:
            conn = psycopg.connect(**connection_params(self.alias, self.application_name))
        conn.add_notify_handler(self.heard.append)
        conn.execute(query("listener_session"), {"key": str(self.key)})
        conn.execute(query("listen_for_jobs"))
        conn.execute(query("listen_for_handover"))
        self.conn = conn
        self.role = Role.IDLE

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

    # ------------------------------------------------------------------ the election

    def step(self, free: bool) -> None:
        """Take this worker's part in the election before the loop waits: with a free slot
        (``free``), get in line for the listener's place; without one, leave that place."""
        if self.conn is None:
            return
        try:
            if free and self.role is Role.IDLE:
                self._wait_in_line()
            elif not free and self.role is Role.LISTENING:
                self._hand_over()
        except Exception as exc:
            self._failed(exc)

    def _wait_in_line(self) -> None:
        assert self.conn is not None
        pgconn = self.conn.pgconn
        pgconn.send_query(query("wait_to_listen").encode())
        self._flush()
        self.role = Role.WAITING

    def _hand_over(self) -> None:
        assert self.conn is not None
        queues = sorted(self.queues) or None
        self.conn.execute(query("hand_over_listening"), {"key": str(self.key), "queues": queues})
        self.conn.execute(query("stop_listening"))
        self.role = Role.IDLE

    def _flush(self) -> None:
        assert self.conn is not None
        pgconn = self.conn.pgconn
        while pgconn.flush():
            select.select([], [pgconn.socket], [], 1.0)

    def drain(self) -> bool:
        """Read what the LISTEN connection received; True if this worker should look for work
        now: it is the listener and a notification for its queues came, or it has just become
        the listener and work may be waiting."""
        if self.conn is None:
            return False
        try:
            pgconn = self.conn.pgconn
            pgconn.consume_input()
            self._read_notifications()
            granted = None
            if self.role is Role.WAITING and not pgconn.is_busy():
                granted = self._granted()
                if granted:
                    # Every notification held back during the wait comes before this reply.
                    self.conn.execute(query("sync_listen_connection"))
                    self._read_notifications()
            work = self._digest()
            claim = False
            if granted is not None:
                self.role = Role.LISTENING if granted else Role.IDLE
                # Claim at once unless the last hand-over said no jobs were left, and no
                # notification for this worker's queues came after it.
                claim = granted and (self.jobs_left is not False or self.work_since_handover)
            elif self.role is Role.LISTENING:
                claim = work
            if pgconn.status != psycopg.pq.ConnStatus.OK:
                raise psycopg.OperationalError("LISTEN connection closed")
        except Exception as exc:
            self._failed(exc)
            return True  # a notification may have been lost: look for work
        return claim

    def _read_notifications(self) -> None:
        assert self.conn is not None
        pgconn = self.conn.pgconn
        while (note := pgconn.notifies()) is not None:
            channel = note.relname.decode(errors="replace")
            payload = note.extra.decode(errors="replace")
            self.heard.append(psycopg.Notify(channel, payload, note.be_pid))

    def _digest(self) -> bool:
        """Take in the notifications heard, in order; True if one is for this worker's queues.
        A hand-over of this queue set's listener is remembered, with whether work came after."""
        work = False
        mine = f"{self.key}:"
        for note in self.heard:
            if note.channel == HANDOVER_CHANNEL and note.payload.startswith(mine):
                self.jobs_left = note.payload[len(mine) :] == "1"
                self.work_since_handover = False
            elif self._for_me(note):
                work = self.work_since_handover = True
        self.heard.clear()
        return work

    def _granted(self) -> bool:
        """The reply to ``wait_to_listen``: whether this session now holds the lock."""
        assert self.conn is not None
        pgconn = self.conn.pgconn
        granted = False
        error = None
        while (result := pgconn.get_result()) is not None:
            if result.status == psycopg.pq.ExecStatus.TUPLES_OK:
                granted = result.get_value(0, 0) == b"on"
            elif result.status != psycopg.pq.ExecStatus.COMMAND_OK:
                error = result.error_message.decode(errors="replace")
        if error:
            raise psycopg.OperationalError(f"waiting to listen failed: {error}")
        return granted

    def _for_me(self, note: psycopg.Notify) -> bool:
        return note.channel == db.CHANNEL and (not self.queues or note.payload in self.queues)

    # ------------------------------------------------------------------ failures

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
        """Close the connection; the server releases the lock, and the next in line listens."""
        if self.conn is not None:
            with contextlib.suppress(Exception):
                self.conn.close()
            self.conn = None
        self.role = Role.DOWN
        self.heard.clear()
        self.jobs_left = None
