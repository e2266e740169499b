"""Operators' actions: retry, cancel, run now, delete; on many jobs, and on one.

The admin calls these with a queryset, which may be "select all" over a filtered list of a
million rows. They walk it in keyset-ordered batches of ids, read without locks, and apply one
statement per small batch (each its own short transaction, with bounded waits), through the same
transition functions that single jobs use, so the same state rules apply everywhere. A statement
locks its batch with ``SKIP LOCKED`` and comes back for the jobs another transaction held; what
is still held after a few tries is reported, never waited for.

The rule, and its exceptions, for every statement that changes jobs: it locks one job (a claim,
a finish, a reap, a heartbeat's release, an operator's action on one job), or a small batch
(``workflows.BATCH``) with ``SKIP LOCKED`` and bounded waits, and comes back for what it skipped.
Enqueueing writes new rows only and locks no other job.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

from django.db import IntegrityError, connections
from django.db.models import Count, QuerySet

from django_jobs import conf, prune, store, workflows
from django_jobs.cursor import Cursor
from django_jobs.models.job import Job
from django_jobs.registry import registry
from django_jobs.states import RETRY
from django_jobs.store import db

BATCH = workflows.BATCH
#: At most this many per-job notes go into an action's message.
NOTES = 10


@dataclasses.dataclass
class ActionReport:
    """How many jobs an action changed, why it skipped the others, and notes on single jobs."""

    changed: int = 0
    skipped: Counter[str] = dataclasses.field(default_factory=Counter)
    notes: list[str] = dataclasses.field(default_factory=list)

    def message(self, done: str) -> str:
        """E.g. ``"3 jobs requeued, 2 skipped: 1 error, 1 running; job #7: ..."``."""
        text = f"{self.changed} job{'s' if self.changed != 1 else ''} {done}"
        if self.skipped:
            reasons = ", ".join(f"{n} {state}" for state, n in sorted(self.skipped.items()))
            text += f", {sum(self.skipped.values())} skipped: {reasons}"
        if self.notes:
            text += "; " + "; ".join(self.notes[:NOTES])
            if len(self.notes) > NOTES:
                text += f"; and {len(self.notes) - NOTES} more"
        return text


def _batches(queryset: QuerySet[Job]) -> Iterator[list[int]]:
    ids = queryset.order_by("pk").values_list("pk", flat=True)
    last = 0
    while True:
        batch = list(ids.filter(pk__gt=last)[:BATCH])
        if not batch:
            return
        yield batch
        last = batch[-1]


Change = Callable[[Any, list[int]], store.Changes]


def _apply(
    queryset: QuerySet[Job],
    change: Change,
    explain: Callable[[Any, list[int], ActionReport], None] | None = None,
) -> ActionReport:
    report = ActionReport()
    alias = conf.database_alias()
    with connections[alias].cursor() as cursor:
        for batch in _batches(queryset):
            result = store.until_free(lambda ids: change(cursor, ids), batch)
            changed = {_job_id(entry) for entry in result.changed}
            report.changed += len(changed)
            if result.busy:
                report.skipped["locked by another transaction"] += len(result.busy)
            skipped = [pk for pk in batch if pk not in changed and pk not in set(result.busy)]
            if skipped:
                rows = Job.objects.using(alias).filter(pk__in=skipped)
                counts = rows.values("state").annotate(n=Count("pk"))
                report.skipped.update({row["state"]: row["n"] for row in counts})
                if explain is not None:
                    explain(cursor, skipped, report)
    return report


def _job_id(entry: Any) -> int:
    return int(getattr(entry, "job_id", entry))


def retry(queryset: QuerySet[Job], *, from_start: bool = False) -> ActionReport:
    """Requeue jobs in error or cancelled, with a fresh budget of attempts each. A job whose
    unique key another active job holds is skipped, with a note that names that job. A job
    resumes from its recorded steps and cursors; ``from_start``: they are forgotten, in the
    retry's own transaction, and it runs again from the beginning."""

    def retried(cursor: Cursor, budgets: dict[int, int]) -> store.Changes:
        with db.atomic(conf.database_alias()):
            return store.retry_many(cursor, budgets, from_start=from_start)

    def change(cursor: Cursor, batch: list[int]) -> store.Changes:
        rows = Job.objects.using(conf.database_alias()).filter(
            pk__in=batch, state__in=RETRY.sources
        )
        budgets = {}
        for pk, task, max_attempts in rows.values_list("pk", "task", "max_attempts"):
            budgets[pk] = registry.max_attempts_for(task, max_attempts)
        if not budgets:
            return store.Changes()
        try:
            return retried(cursor, budgets)
        except IntegrityError:
            # A job with the same unique key was enqueued at this very moment: go one by one,
            # so that only the jobs whose key is taken are skipped.
            result = store.Changes()
            for pk, budget in budgets.items():
                try:
                    one = retried(cursor, {pk: budget})
                except IntegrityError:
                    continue
                result.changed += one.changed
                result.busy += one.busy
            return result

    def explain(cursor: Cursor, skipped: list[int], report: ActionReport) -> None:
        holders = store.unique_key_holders(cursor, skipped)
        for job_id, (key, holder, state) in sorted(holders.items()):
            report.notes.append(
                f"job #{job_id}: unique key {key!r} is held by job #{holder} ({state})"
            )

    return _apply(queryset, change, explain)


def cancel(queryset: QuerySet[Job]) -> ActionReport:
    """Cancel jobs (pending and waiting at once, running ones asked to stop), with cascades."""

    return _apply(queryset, workflows.cancel_batch_with_cascade)


def run_now(queryset: QuerySet[Job]) -> ActionReport:
    """Make pending jobs that are scheduled for later ready now."""
    return _apply(queryset, store.run_now_many)


def delete(queryset: QuerySet[Job]) -> ActionReport:
    """Delete finished jobs, with their attempts and dependency rows, a small batch per
    statement (see prune.delete_jobs); unfinished ones are skipped."""
    return _apply(queryset, prune.delete_jobs)
