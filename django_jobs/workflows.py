"""Dependencies, child jobs and cancellation cascades, built from plain rows and short statements.

A job enqueued with ``depends_on`` starts ``waiting`` (``attempt = 0``) unless all its
dependencies are already done. A job whose function returned while children it spawned are
unfinished also waits (``attempt > 0``: it has run), holding no worker and no lock, until its
last child ends; it is then *finalized*: done if every child is done, error if one ended error,
cancelled if one was cancelled.

When a job reaches a final state (or starts waiting for children), :func:`settle` does what
follows from it, each step a short statement of its own, in bounded batches:

- done: promote waiting dependents whose dependencies are now all done;
- error or cancelled (for good): cancel every job downstream of it, transitively, naming it;
- in any final state: try to finalize its parent, and settle the parent in turn.

These run *after* the job's own state change has committed, in separate transactions. That
ordering is what makes two dependencies (or two children) that end at the same instant on
different workers safe: whichever commits last sees the other's result, so the dependent is
promoted (or the parent finalized) at least once, and the ``WHERE state = 'waiting'`` guard makes
it at most once. If a process dies between the two, :func:`repair` (run by the reaper) finds and
settles what was left.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Sequence
from typing import Any

from django_jobs import db
from django_jobs.states import ACTIVE_STATES, TERMINAL_STATES, sql_in

logger = logging.getLogger("django_jobs.workflows")

BATCH = 500
JOB = "django_jobs_job"
DEP = "django_jobs_dependency"

# Dependents of one job, a page at a time (keyset on job_id), that are waiting and whose every
# dependency is done. Index: django_jobs_dependency(depends_on_id) then the unique (job_id, ...).
_PROMOTE = f"""
WITH page AS (
    SELECT d.job_id FROM {DEP} d
    WHERE d.depends_on_id = %(job_id)s AND d.job_id > %(after)s
    ORDER BY d.job_id LIMIT %(batch)s
), promoted AS (
    UPDATE {JOB} w SET state = 'pending', run_after = GREATEST(w.run_after, now())
    FROM page
    WHERE w.id = page.job_id AND w.state = 'waiting' AND w.attempt = 0
      AND NOT EXISTS (
          SELECT 1 FROM {DEP} d2 JOIN {JOB} dj ON dj.id = d2.depends_on_id
          WHERE d2.job_id = w.id AND dj.state <> 'done'
      )
    RETURNING w.id, (CASE WHEN w.run_after <= now()
                          THEN pg_notify('{db.CHANNEL}', w.queue) END) IS NULL
)
SELECT (SELECT max(job_id) FROM page), (SELECT count(*) FROM promoted)
"""

# Waiting or pending dependents of one job, a page at a time, cancelled with a reason that names
# the upstream job where the failure started.
_CANCEL_DEPENDENTS = f"""
WITH page AS (
    SELECT d.job_id FROM {DEP} d
    WHERE d.depends_on_id = %(job_id)s AND d.job_id > %(after)s
    ORDER BY d.job_id LIMIT %(batch)s
), cancelled AS (
    UPDATE {JOB} w SET state = 'cancelled', finished_at = now(), error = %(reason)s
    FROM page
    WHERE w.id = page.job_id AND w.state IN ('waiting', 'pending')
    RETURNING w.id, w.parent_id
)
SELECT (SELECT max(job_id) FROM page), NULL, NULL
UNION ALL
SELECT NULL, id, parent_id FROM cancelled
"""

# Finalize a parent that is waiting for children, once none is active. The aggregate over the
# children runs only if the parent qualifies. Index: job_parent_id (the foreign key's index).
_FINALIZE_PARENT = f"""
WITH ready AS (
    SELECT p.id FROM {JOB} p
    WHERE p.id = %(job_id)s AND p.state = 'waiting' AND p.attempt > 0
      AND NOT EXISTS (
          SELECT 1 FROM {JOB} c
          WHERE c.parent_id = p.id AND c.state IN {sql_in(ACTIVE_STATES)}
      )
), kids AS (
    SELECT min(c.id) FILTER (WHERE c.state = 'error') AS first_error,
           min(c.id) FILTER (WHERE c.state = 'cancelled') AS first_cancelled
    FROM {JOB} c WHERE c.parent_id IN (SELECT id FROM ready)
)
UPDATE {JOB} p
SET state = CASE WHEN k.first_error IS NOT NULL THEN 'error'
                 WHEN k.first_cancelled IS NOT NULL THEN 'cancelled'
                 ELSE 'done' END,
    finished_at = now(),
    error = CASE WHEN k.first_error IS NOT NULL
                 THEN 'child job #' || k.first_error || ' ended in error'
                 WHEN k.first_cancelled IS NOT NULL
                 THEN 'child job #' || k.first_cancelled || ' was cancelled'
                 ELSE p.error END
FROM ready, kids k
WHERE p.id = ready.id AND p.state = 'waiting'
RETURNING p.state
"""


def _job(cursor: Any, job_id: int) -> tuple[str, int | None, int, str] | None:
    return db.execute(
        cursor, f"SELECT state, parent_id, attempt, task FROM {JOB} WHERE id = %s", [job_id]
    ).fetchone()


def finalize_parent(cursor: Any, job_id: int) -> str | None:
    """Finalize ``job_id`` if it waits for children and none is active; return its new state."""
    row = db.execute(cursor, _FINALIZE_PARENT, {"job_id": job_id}).fetchone()
    if row is not None:
        logger.info(
            "job %d finalized %s: its children have finished",
            job_id,
            row[0],
            extra={"job_id": job_id, "state": row[0]},
        )
    return None if row is None else row[0]


def promote_dependents(cursor: Any, job_id: int) -> int:
    """Move waiting dependents of ``job_id`` whose dependencies are all done to pending."""
    promoted, after = 0, 0
    while True:
        last, count = db.execute(
            cursor, _PROMOTE, {"job_id": job_id, "after": after, "batch": BATCH}
        ).fetchone()
        promoted += count
        if last is None:
            return promoted
        after = last


def _cascade(cursor: Any, sql: str, job_id: int, reason: str) -> list[tuple[int, int | None]]:
    """Walk breadth first from ``job_id``: ``sql`` changes one page of the next jobs linked to
    one job and returns the page's last key, then ``(id, parent_id)`` of each job it changed,
    which are walked in turn. Returns every job changed."""
    changed: list[tuple[int, int | None]] = []
    frontier: deque[int] = deque([job_id])
    while frontier:
        current, after = frontier.popleft(), 0
        while True:
            rows = db.execute(
                cursor, sql, {"job_id": current, "after": after, "batch": BATCH, "reason": reason}
            ).fetchall()
            for _, changed_id, parent_id in rows[1:]:
                changed.append((changed_id, parent_id))
                frontier.append(changed_id)
            last = rows[0][0]
            if last is None:
                break
            after = last
    return changed


def cancel_downstream(cursor: Any, job_id: int, reason: str) -> list[tuple[int, int | None]]:
    """Cancel every waiting or pending job downstream of ``job_id`` (transitively), in pages.
    Returns ``(id, parent_id)`` of each job cancelled."""
    return _cascade(cursor, _CANCEL_DEPENDENTS, job_id, reason)


def settle(cursor: Any, job_id: int) -> None:
    """Do what follows from ``job_id``'s state for its dependents and its parent (see above)."""
    todo: deque[int] = deque([job_id])
    while todo:
        current = todo.popleft()
        row = _job(cursor, current)
        if row is None:
            continue
        state, parent_id, attempt, task = row
        if state == "waiting" and attempt > 0:
            if finalize_parent(cursor, current) is not None:
                todo.append(current)  # now final: settle its dependents and parent
            continue
        if state not in TERMINAL_STATES:
            continue
        if state == "done":
            promote_dependents(cursor, current)
        else:
            reason = f"cancelled: upstream job #{current} ({task}) ended {state}"
            for _cancelled_id, cancelled_parent in cancel_downstream(cursor, current, reason):
                if cancelled_parent is not None:
                    todo.append(cancelled_parent)
        if parent_id is not None:
            todo.append(parent_id)


# Requesting cancellation of a job's descendants: pending and waiting ones end at once, running
# ones are flagged for their workers. One level of children per statement, a page at a time.
_CANCEL_CHILDREN = f"""
WITH page AS (
    SELECT c.id FROM {JOB} c
    WHERE c.parent_id = %(job_id)s AND c.id > %(after)s AND c.state IN {sql_in(ACTIVE_STATES)}
    ORDER BY c.id LIMIT %(batch)s
), changed AS (
    UPDATE {JOB} c
    SET state = CASE WHEN c.state = 'running' THEN 'running' ELSE 'cancelled' END,
        cancel_requested = true,
        finished_at = CASE WHEN c.state = 'running' THEN NULL ELSE now() END,
        error = CASE WHEN c.state = 'running' THEN c.error ELSE %(reason)s END
    FROM page
    WHERE c.id = page.id AND c.state IN {sql_in(ACTIVE_STATES)}
    RETURNING c.id, c.parent_id
)
SELECT (SELECT max(id) FROM page), NULL, NULL
UNION ALL
SELECT NULL, id, parent_id FROM changed
"""


def cancel_many(cursor: Any, ids: Sequence[int], reason: str = "cancelled") -> list[Any]:
    """Cancel jobs and everything hanging off them.

    Each job: pending or waiting ends at once, running is asked to stop (its worker stops it
    within a heartbeat interval). Its descendants likewise. Its dependents, transitively, are
    cancelled once it has ended. Returns :class:`~django_jobs.transitions.Cancelled` entries for
    the jobs named in ``ids`` that changed.
    """
    from django_jobs import transitions

    changed = transitions.cancel_many(cursor, ids, reason)
    for entry in changed:
        if entry.linked:
            _cancel_descendants(cursor, entry.job_id)
            if entry.state == "cancelled":
                settle(cursor, entry.job_id)
    return changed


def cancel(cursor: Any, job_id: int, reason: str = "cancelled") -> str | None:
    """Cancel one job and what hangs off it; its state after, or None if already finished."""
    changed = cancel_many(cursor, [job_id], reason)
    return changed[0].state if changed else None


def _cancel_descendants(cursor: Any, job_id: int) -> None:
    _cascade(cursor, _CANCEL_CHILDREN, job_id, f"cancelled: ancestor job #{job_id} was cancelled")


# Jobs a crash may have left unsettled: waiting with nothing left to wait for. Index: a scan of
# waiting jobs (few, normally), with the same subqueries as above per row.
_UNSETTLED = f"""
SELECT w.id FROM {JOB} w
WHERE w.state = 'waiting' AND (
    (w.attempt > 0 AND NOT EXISTS (
        SELECT 1 FROM {JOB} c WHERE c.parent_id = w.id AND c.state IN {sql_in(ACTIVE_STATES)}))
    OR (w.attempt = 0 AND NOT EXISTS (
        SELECT 1 FROM {DEP} d JOIN {JOB} dj ON dj.id = d.depends_on_id
        WHERE d.job_id = w.id AND dj.state <> 'done'))
    OR (w.attempt = 0 AND EXISTS (
        SELECT 1 FROM {DEP} d JOIN {JOB} dj ON dj.id = d.depends_on_id
        WHERE d.job_id = w.id AND dj.state IN ('error', 'cancelled')))
)
ORDER BY w.id
LIMIT %(limit)s
"""


def repair(cursor: Any, limit: int = 1000) -> list[int]:
    """Settle waiting jobs that have nothing left to wait for (after a crash between a job's end
    and the settling that should have followed it). Returns the ids it looked at."""
    stuck = [row[0] for row in db.execute(cursor, _UNSETTLED, {"limit": limit}).fetchall()]
    for job_id in stuck:
        row = _job(cursor, job_id)
        if row is None or row[0] != "waiting":
            continue
        if row[2] > 0:
            settle(cursor, job_id)
            continue
        # A dependency-waiting job: settle the dependencies, which promotes or cancels it.
        for (upstream,) in db.execute(
            cursor, f"SELECT depends_on_id FROM {DEP} WHERE job_id = %s", [job_id]
        ).fetchall():
            settle(cursor, upstream)
    return stuck
