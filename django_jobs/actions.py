"""Operators' actions on many jobs: retry, cancel, run now.

The admin calls these with a queryset, which may be "select all" over a filtered list of a
million rows. They walk it in keyset-ordered batches of ids and apply one set-based statement per
batch (each its own short transaction), through the same transition functions that single jobs
use, so the same state rules apply everywhere.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

from django.db import connections
from django.db.models import Count, QuerySet

from django_jobs import conf, transitions, workflows
from django_jobs.models import Job
from django_jobs.registry import registry

BATCH = 1000


@dataclasses.dataclass
class ActionReport:
    """How many jobs an action changed, and the states of those it skipped."""

    changed: int = 0
    skipped: Counter[str] = dataclasses.field(default_factory=Counter)

    def message(self, done: str) -> str:
        """E.g. ``"3 jobs requeued, 2 skipped: running"``."""
        text = f"{self.changed} job{'s' if self.changed != 1 else ''} {done}"
        if self.skipped:
            reasons = ", ".join(f"{n} {state}" for state, n in sorted(self.skipped.items()))
            text += f", {sum(self.skipped.values())} skipped: {reasons}"
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


def _apply(queryset: QuerySet[Job], change: Callable[[Any, list[int]], list[int]]) -> ActionReport:
    report = ActionReport()
    with connections[conf.database_alias()].cursor() as cursor:
        for batch in _batches(queryset):
            changed = set(change(cursor, batch))
            report.changed += len(changed)
            skipped = [pk for pk in batch if pk not in changed]
            if skipped:
                rows = Job.objects.filter(pk__in=skipped).values("state").annotate(n=Count("pk"))
                report.skipped.update({row["state"]: row["n"] for row in rows})
    return report


def retry(queryset: QuerySet[Job]) -> ActionReport:
    """Requeue jobs in error or cancelled, with a fresh budget of attempts each."""

    def change(cursor: Any, batch: list[int]) -> list[int]:
        rows = Job.objects.filter(pk__in=batch, state__in=["error", "cancelled"])
        budgets = {}
        for pk, task, max_attempts in rows.values_list("pk", "task", "max_attempts"):
            budgets[pk] = registry.max_attempts_for(task, max_attempts)
        return transitions.retry_many(cursor, budgets) if budgets else []

    return _apply(queryset, change)


def cancel(queryset: QuerySet[Job]) -> ActionReport:
    """Cancel jobs (pending and waiting at once, running ones asked to stop), with cascades."""
    return _apply(
        queryset,
        lambda cursor, batch: [c.job_id for c in workflows.cancel_many(cursor, batch)],
    )


def run_now(queryset: QuerySet[Job]) -> ActionReport:
    """Make pending jobs that are scheduled for later ready now."""
    return _apply(queryset, transitions.run_now_many)
