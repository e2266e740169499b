"""Retention: delete finished jobs, with their attempts and dependency rows, in bounded batches.

Each batch is one statement in its own short transaction: it takes the next ``batch_size``
finished jobs in ``(finished_at, id)`` order, keeps those an unfinished job still needs, locks
the rest with ``SKIP LOCKED`` and deletes them. No batch holds a lock for long, and nothing is
one giant transaction, so workers keep claiming while a prune runs and autovacuum can reclaim
the space of earlier batches while later ones are still running.

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
from typing import Any

from django.db import connections, transaction

from django_jobs import conf, db, transitions
from django_jobs.states import ACTIVE_STATES, TERMINAL_STATES, sql_in

JOB = "django_jobs_job"
ATTEMPT = "django_jobs_attempt"
DEPENDENCY = "django_jobs_dependency"

# The next batch of candidates, then the ones to keep. The candidates come from
# job_finished_idx (partial on the finished states), resuming after the last batch's
# (finished_at, id), so kept jobs are not read again. Descendants are found through the index
# of the parent_id foreign key; unfinished dependents through django_jobs_dependency's index on
# depends_on_id and the job primary key.
_CANDIDATES = f"""
WITH RECURSIVE batch AS (
    SELECT id, finished_at FROM {JOB}
    WHERE state IN {sql_in(TERMINAL_STATES)} AND state = ANY(%(states)s)
      AND finished_at < %(cutoff)s
      AND (finished_at, id) > (%(after_at)s::timestamptz, %(after_id)s)
    ORDER BY finished_at, id
    LIMIT %(batch_size)s
), descendants (root, id, state) AS (
    SELECT b.id, c.id, c.state FROM batch b JOIN {JOB} c ON c.parent_id = b.id
    UNION
    -- OFFSET 0 keeps each level a lookup per job found so far; as a plain join, the planner
    -- (which cannot know how deep the trees go) may scan the whole parent_id index per level.
    SELECT d.root, c.id, c.state FROM descendants d
    CROSS JOIN LATERAL (SELECT id, state FROM {JOB} WHERE parent_id = d.id OFFSET 0) c
), kept AS (
    SELECT root AS id FROM descendants WHERE state IN {sql_in(ACTIVE_STATES)}
    UNION
    SELECT b.id FROM batch b
    JOIN {DEPENDENCY} dep ON dep.depends_on_id = b.id
    JOIN {JOB} u ON u.id = dep.job_id
    WHERE u.state IN {sql_in(ACTIVE_STATES)}
), last AS (
    SELECT finished_at, id FROM batch ORDER BY finished_at DESC, id DESC LIMIT 1
)"""

# Deleting jobs that a CTE ``locked`` holds (FOR UPDATE, SKIP LOCKED): their children that stay
# are locked likewise, and a job whose children cannot all be locked now is left for another
# try; then the attempts and dependency rows of the rest go, children that stay lose their
# parent_id, and the jobs go, all in the same statement. Attempts go by attempt_job_number_idx,
# dependency rows by dependency_unique (job_id, ...) and dependency_depends_on_idx, children by
# job_parent_idx.
_DELETE_LOCKED = f"""
), children AS (
    SELECT c.id, c.parent_id FROM {JOB} c
    WHERE c.parent_id IN (SELECT id FROM locked) AND c.id NOT IN (SELECT id FROM locked)
), held_children AS (
    SELECT c.id FROM {JOB} c WHERE c.id IN (SELECT id FROM children)
    FOR NO KEY UPDATE OF c SKIP LOCKED
), doomed AS (
    SELECT l.id FROM locked l
    WHERE NOT EXISTS (
        SELECT 1 FROM children c
        WHERE c.parent_id = l.id AND c.id NOT IN (SELECT id FROM held_children))
), attempts AS (
    DELETE FROM {ATTEMPT} a USING doomed WHERE a.job_id = doomed.id RETURNING 1
), own_links AS (
    DELETE FROM {DEPENDENCY} d USING doomed WHERE d.job_id = doomed.id RETURNING 1
), links_to AS (
    DELETE FROM {DEPENDENCY} d USING doomed
    WHERE d.depends_on_id = doomed.id AND d.job_id NOT IN (SELECT id FROM doomed) RETURNING 1
), orphans AS (
    UPDATE {JOB} c SET parent_id = NULL FROM doomed
    WHERE c.parent_id = doomed.id AND c.id NOT IN (SELECT id FROM doomed) RETURNING 1
), jobs AS (
    DELETE FROM {JOB} j USING doomed WHERE j.id = doomed.id RETURNING j.id
)"""

# Delete a batch of the prune: lock the candidates that are not kept (re-checking their state,
# since an operator may have retried one meanwhile; SKIP LOCKED passes over rows someone is
# writing), and delete them as above.
_DELETE = (
    _CANDIDATES
    + f""", locked AS (
    SELECT j.id FROM batch b JOIN {JOB} j ON j.id = b.id
    WHERE b.id NOT IN (SELECT id FROM kept)
      AND j.state IN {sql_in(TERMINAL_STATES)} AND j.state = ANY(%(states)s)
      AND j.finished_at < %(cutoff)s
    FOR UPDATE OF j SKIP LOCKED"""
    + _DELETE_LOCKED
    + """
SELECT (SELECT count(*) FROM batch), (SELECT count(*) FROM jobs),
       (SELECT count(*) FROM attempts),
       (SELECT count(*) FROM own_links) + (SELECT count(*) FROM links_to),
       (SELECT count(*) FROM orphans),
       (SELECT finished_at FROM last), (SELECT id FROM last)
"""
)

# The same batch, counted instead of deleted (--dry-run). A dependency row between a job of this
# batch and a job pruned in another batch is counted with its dependent job, once. (The count
# misses a row whose dependent is kept in another batch: rare, and only in a dry run.)
_COUNT = (
    _CANDIDATES
    + f""", doomed AS (
    SELECT id FROM batch WHERE id NOT IN (SELECT id FROM kept)
)
SELECT (SELECT count(*) FROM batch), (SELECT count(*) FROM doomed),
       (SELECT count(*) FROM {ATTEMPT} a WHERE a.job_id IN (SELECT id FROM doomed)),
       (SELECT count(*) FROM {DEPENDENCY} d WHERE d.job_id IN (SELECT id FROM doomed))
       + (SELECT count(*) FROM {DEPENDENCY} d JOIN {JOB} u ON u.id = d.job_id
          WHERE d.depends_on_id IN (SELECT id FROM doomed)
            AND d.job_id NOT IN (SELECT id FROM doomed)
            AND (u.id IN (SELECT id FROM kept)
                 OR NOT (u.state IN {sql_in(TERMINAL_STATES)} AND u.state = ANY(%(states)s)
                         AND u.finished_at < %(cutoff)s))),
       (SELECT count(*) FROM {JOB} c
        WHERE c.parent_id IN (SELECT id FROM doomed) AND c.id NOT IN (SELECT id FROM doomed)),
       (SELECT finished_at FROM last), (SELECT id FROM last)
"""
)


# Delete the finished jobs among a small batch of ids (the admin's delete), as above. The ids of
# finished jobs left alone come back as busy.
_DELETE_JOBS = (
    f"""
WITH locked AS (
    SELECT j.id FROM {JOB} j
    WHERE j.id = ANY(%(ids)s) AND j.state IN {sql_in(TERMINAL_STATES)}
    FOR UPDATE OF j SKIP LOCKED"""
    + _DELETE_LOCKED
    + f"""
SELECT id, 'deleted' FROM jobs
UNION ALL
SELECT j.id, 'busy' FROM {JOB} j
WHERE j.id = ANY(%(ids)s) AND j.state IN {sql_in(TERMINAL_STATES)}
  AND j.id NOT IN (SELECT id FROM doomed)
"""
)


def delete_jobs(cursor: Any, ids: list[int]) -> transitions.Changes:
    """Delete the finished jobs among ``ids`` (see above): the ids deleted, and those another
    transaction held."""
    return transitions.changes_of(db.execute(cursor, _DELETE_JOBS, {"ids": ids}).fetchall())


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
        return line + f" ({self.batches} batch(es), {self.elapsed:.1f}s)"


def check_states(states: Iterable[str]) -> tuple[str, ...]:
    """The states to prune, validated: finished states only."""
    chosen = tuple(dict.fromkeys(s.strip() for s in states if s.strip()))
    wrong = [s for s in chosen if s not in TERMINAL_STATES]
    if not chosen or wrong:
        raise ValueError(
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
        raise ValueError("batch_size must be at least 1")
    defaults = conf.retention()
    chosen = check_states(states if states is not None else defaults.states)
    age = defaults.older_than if older_than is None else older_than
    alias = conf.database_alias()
    started = time.monotonic()
    with connections[alias].cursor() as cursor:
        # One cutoff from the database's clock for the whole run.
        cursor.execute("SELECT now() - %s::interval", [age])
        cutoff = cursor.fetchone()[0]
    result = PruneResult(cutoff=cutoff, states=chosen, dry_run=dry_run)
    params: dict[str, Any] = {
        "states": list(chosen),
        "cutoff": cutoff,
        "after_at": "-infinity",
        "after_id": 0,
        "batch_size": batch_size,
    }
    while True:
        with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
            # The planner cannot tell how deep job trees go, so it overrates this statement;
            # JIT compiling it would cost far more than running it.
            cursor.execute(
                "SELECT set_config('lock_timeout', %s, true), "
                "set_config('statement_timeout', %s, true), set_config('jit', 'off', true)",
                [f"{conf.lock_timeout_ms()}ms", f"{conf.statement_timeout_ms()}ms"],
            )
            cursor.execute(_COUNT if dry_run else _DELETE, params)
            scanned, jobs, attempts, dependencies, orphans, last_at, last_id = cursor.fetchone()
        if scanned == 0:
            break
        result.batches += 1
        result.jobs += jobs
        result.attempts += attempts
        result.dependencies += dependencies
        result.orphaned_children += orphans
        result.kept += scanned - jobs
        result.elapsed = time.monotonic() - started
        if progress is not None:
            progress(result)
        if scanned < batch_size:
            break
        params.update(after_at=last_at, after_id=last_id)
    result.elapsed = time.monotonic() - started
    return result
