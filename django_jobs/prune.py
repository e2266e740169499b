"""Retention: delete finished jobs, with their attempts and dependency rows, in bounded batches.

Each batch is one statement (``prune_batch`` of django_jobs/store/sql/prune.sql) in its own short
transaction: it takes the next ``batch_size`` finished jobs in ``(finished_at, id)`` order,
keeps those an unfinished job still needs, locks the rest with ``SKIP LOCKED`` and deletes them.
No batch holds a lock for long, and nothing is one giant transaction, so workers keep claiming
while a prune runs and autovacuum can reclaim the space of earlier batches while later ones are
still running.

A finished job is kept while an unfinished job (waiting, pending or running) depends on it
through ``django_jobs_dependency``, or descends from it through ``parent_id`` (at any depth).
When a pruned job's finished children stay, their ``parent_id`` is cleared, as the model's
``on_delete=SET_NULL`` would do.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from django.db import connections

from django_jobs import conf, rollups, store
from django_jobs.cursor import Cursor
from django_jobs.exceptions import InvalidOption
from django_jobs.states import TERMINAL_STATES
from django_jobs.store import db
from django_jobs.store import rollups as rollup_statements
from django_jobs.store.sql import query


def delete_jobs(cursor: Cursor, ids: list[int]) -> store.Changes:
    """Delete the finished jobs among ``ids`` as a prune would: the ids deleted, and those
    another transaction held."""
    return store.changes_of(db.execute(cursor, query("delete_finished_jobs"), {"ids": ids}))


@dataclasses.dataclass
class PruneResult:
    """What a prune did so far (or, in a dry run, would do)."""

    cutoff: datetime
    states: tuple[str, ...]
    dry_run: bool = False
    jobs: int = 0
    attempts: int = 0
    dependencies: int = 0
    orphaned_children: int = 0
    kept: int = 0
    #: Periodic jobs' tick records deleted (they go with the same cutoff).
    ticks: int = 0
    #: Hourly rollup rows deleted (older than ``JOBS_ROLLUP_RETENTION``).
    rollups: int = 0
    batches: int = 0
    elapsed: float = 0.0

    def summary(self) -> str:
        verb = "would delete" if self.dry_run else "deleted"
        line = (
            f"{verb} {self.jobs} job(s) ({', '.join(self.states)}) finished before "
            f"{self.cutoff:%Y-%m-%d %H:%M:%S %Z}, with {self.attempts} attempt(s) and "
            f"{self.dependencies} dependency row(s)"
        )
        if self.kept:
            line += f"; kept {self.kept} that unfinished jobs still need or were being written"
        if self.ticks:
            line += f"; {self.ticks} schedule tick record(s)"
        if self.rollups:
            line += f"; {self.rollups} hourly rollup row(s) past their retention"
        return line + f" ({self.batches} batch(es), {self.elapsed:.1f}s)"


class _Ticks(NamedTuple):
    #: Tick records deleted (or, in a dry run, that would be).
    ticks: int


def _prune_ticks(alias: str, cutoff: datetime, batch_size: int, dry_run: bool) -> int:
    """Delete the tick records created before ``cutoff``, ``batch_size`` per transaction."""
    params = {"cutoff": cutoff, "batch_size": batch_size}
    deleted = 0
    statement = query("count_old_ticks" if dry_run else "prune_ticks")
    while True:
        with connections[alias].cursor() as cursor:
            ticks = db.fetch_one_as(db.execute(cursor, statement, params), _Ticks)
        assert ticks is not None  # a count has one row
        if dry_run:
            return ticks.ticks
        deleted += ticks.ticks
        if ticks.ticks < batch_size:
            return deleted


def _prune_rollups(alias: str, age: timedelta, batch_size: int) -> int:
    """Delete the hourly rollup rows older than ``age``, ``batch_size`` per transaction."""
    deleted = 0
    while True:
        with connections[alias].cursor() as cursor:
            gone = rollup_statements.prune(cursor, age, batch_size)
        deleted += gone
        if gone < batch_size:
            return deleted


class _Cutoff(NamedTuple):
    cutoff: datetime


class _Batch(NamedTuple):
    """What one batch of prune_batch (or prune_batch_count) did."""

    scanned: int
    jobs: int
    attempts: int
    dependencies: int
    orphans: int
    #: Where the next batch resumes: the last scanned job's finish and id.
    last_at: datetime | None
    last_id: int | None


def check_states(states: Iterable[str]) -> tuple[str, ...]:
    """The states to prune, validated: finished states only."""
    chosen = tuple(dict.fromkeys(s.strip() for s in states if s.strip()))
    wrong = [s for s in chosen if s not in TERMINAL_STATES]
    if not chosen or wrong:
        raise InvalidOption(
            f"only finished jobs can be pruned: choose from {', '.join(sorted(TERMINAL_STATES))}"
            + (f" (not {', '.join(wrong)})" if wrong else "")
        )
    return chosen


def prune(
    *,
    older_than: timedelta | None = None,
    states: Iterable[str] | None = None,
    dry_run: bool = False,
    batch_size: int = 1000,
    progress: Callable[[PruneResult], None] | None = None,
) -> PruneResult:
    """Delete finished jobs in ``states`` that finished more than ``older_than`` ago (both
    default to ``JOBS_RETENTION``), ``batch_size`` at a time; call ``progress`` after each
    batch. With ``dry_run``, count instead of deleting."""
    if batch_size < 1:
        raise InvalidOption("batch_size must be at least 1")
    defaults = conf.retention()
    chosen = check_states(states if states is not None else defaults.states)
    age = defaults.older_than if older_than is None else older_than
    alias = conf.database_alias()
    started = time.monotonic()
    if not dry_run:
        # History first: the hours that have closed are rolled up before anything goes, and
        # nothing finished after the watermark is deleted (a dry run counts up to where the
        # watermark would be).
        rollups.roll_up(alias=alias)
    with connections[alias].cursor() as cursor:
        clock = db.fetch_one_as(db.execute(cursor, query("prune_cutoff"), {"age": age}), _Cutoff)
        assert clock is not None  # a SELECT without FROM has one row
        where = rollup_statements.span(cursor, rollups.ROLLUP_DELAY)
    # With no watermark, nothing had finished before the last closed hour.
    watermark = where.closed_until if dry_run or where.rolled_until is None else where.rolled_until
    cutoff = min(clock.cutoff, watermark)
    result = PruneResult(cutoff=cutoff, states=chosen, dry_run=dry_run)
    params: dict[str, Any] = {
        "states": list(chosen),
        "cutoff": cutoff,
        "after_at": "-infinity",
        "after_id": 0,
        "batch_size": batch_size,
    }
    statement = query("prune_batch_count" if dry_run else "prune_batch")
    while True:
        # Each batch its own short transaction, with the bounded waits of db.py (and without
        # JIT: the planner cannot tell how deep job trees go, so it overrates this statement).
        with connections[alias].cursor() as cursor:
            batch = db.fetch_one_as(db.execute(cursor, statement, params), _Batch)
        assert batch is not None  # a statement of counts has one row
        if batch.scanned == 0:
            break
        result.batches += 1
        result.jobs += batch.jobs
        result.attempts += batch.attempts
        result.dependencies += batch.dependencies
        result.orphaned_children += batch.orphans
        result.kept += batch.scanned - batch.jobs
        result.elapsed = time.monotonic() - started
        if progress is not None:
            progress(result)
        if batch.scanned < batch_size:
            break
        params.update(after_at=batch.last_at, after_id=batch.last_id)
    result.ticks = _prune_ticks(alias, cutoff, batch_size, dry_run)
    if not dry_run:
        result.rollups = _prune_rollups(alias, conf.rollup_retention(), batch_size)
    result.elapsed = time.monotonic() - started
    return result
