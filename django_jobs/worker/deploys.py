"""Jobs of tasks this worker has not registered: the rolling-deploy hand-back.

During a rolling deploy, pods of the new release enqueue jobs of tasks that the old release's
workers have not registered. A worker never hands its executor a name it would have to import:
it hands such a job back to ``pending`` without counting the attempt (store.hand_back),
and its claims pass over the task's jobs for ``JOBS_UNKNOWN_TASK_DELAY`` seconds, so that a
worker that has the task takes them. The job ends in error only once workers have been found
without its task for ``JOBS_UNKNOWN_TASK_TIMEOUT`` and no live worker has registered it.
"""

from __future__ import annotations

import collections
import datetime
import logging
import time
from typing import Any

from django_jobs import conf, store
from django_jobs.exceptions import REGISTERED_TASKS_HINT, UnknownTask
from django_jobs.store import HandBack

logger = logging.getLogger("django_jobs.worker")


class UnknownTasks:
    """What one worker knows of the tasks it has not registered."""

    def __init__(self, worker_id: str) -> None:
        self.worker_id = worker_id
        # Tasks whose jobs claims pass over, until when (monotonic); and since when (the
        # database's clock) workers have been found without each.
        self.passed_over: dict[str, float] = {}
        self.missing_since: dict[str, datetime.datetime] = {}
        # Jobs handed back, by task, not yet logged; and when each task's last line was.
        self.handed_back: collections.Counter[str] = collections.Counter()
        self.logged_at: dict[str, float] = {}

    def skip(self) -> list[str]:
        """The tasks whose jobs claims pass over for now: those this worker has just handed
        back a job of. Once the pause is over it looks again, to give up on jobs that no worker
        has taken for JOBS_UNKNOWN_TASK_TIMEOUT."""
        now = time.monotonic()
        for task, until in list(self.passed_over.items()):
            if until <= now:
                del self.passed_over[task]
        return sorted(self.passed_over)

    def seen_since(self, task: str) -> datetime.datetime | None:
        """Since when this worker has seen workers without ``task``, if it has."""
        return self.missing_since.get(task)

    def note(self, task: str, handed: HandBack | None) -> str | None:
        """Take note of what became of a job of ``task`` that was handed back (``None``: its
        lease was lost); return the verdict."""
        if handed is None:
            return None
        self.missing_since.setdefault(task, handed.missing_since)
        if handed.verdict == store.HANDED_BACK:
            self.passed_over[task] = time.monotonic() + conf.unknown_task_delay()
            self._log(task)
        return handed.verdict

    def _log(self, task: str) -> None:
        # A line per task a minute, not one per job: a deploy may hand back thousands.
        self.handed_back[task] += 1
        now = time.monotonic()
        if now - self.logged_at.get(task, float("-inf")) < 60:
            return
        self.logged_at[task] = now
        logger.warning(
            "handed back %d job(s) of task %r: it is not registered in this worker, which passes"
            " over its jobs for %gs at a time; a worker that has it runs them. Jobs are"
            " registered from an installed app's jobs.py (tasks.py for @task functions of"
            " Django's Tasks framework) or a module imported at startup. %s",
            self.handed_back.pop(task),
            task,
            conf.unknown_task_delay(),
            REGISTERED_TASKS_HINT,
            extra={"worker_id": self.worker_id, "task": task, "event": "hand_back"},
        )


def expired(task: str, give_up_after: float) -> dict[str, Any]:
    """The finish of a job whose task no live worker has registered for ``give_up_after``."""
    error = (
        f"{UnknownTask(task)} No live worker has registered it for"
        f" {give_up_after:g}s (JOBS_UNKNOWN_TASK_TIMEOUT)."
    )
    return {"error": error[:2000], "retryable": False, "retry_delay": 0.0}
