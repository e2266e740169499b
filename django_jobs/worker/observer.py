"""Hooks into a worker's life, for measuring it from inside its process.

``bench/cost.py`` subclasses :class:`Observer` to trace the queue connection's protocol and to
read the CPU time of the supervisor, its executors and the database backend between the first
claim and the shutdown. Each hook is called at one moment, and does nothing here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import psycopg

    from django_jobs.store import ClaimedJob


class Observer:
    def connected(self, connection: psycopg.Connection[Any]) -> None:
        """The queue connection was opened (again): ``connection`` is still unused."""

    def executor_ready(self, pid: int) -> None:
        """The executor process ``pid`` has started, and is ready for jobs."""

    def claimed(self, job: ClaimedJob) -> None:
        """``job`` was claimed, and is about to start."""

    def stopping(self, executor_pids: list[int]) -> None:
        """The executors are about to be shut down."""
