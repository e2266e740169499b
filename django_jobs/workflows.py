"""Dependencies, child jobs and cancellation cascades, built from plain rows and short statements.

A job enqueued with ``depends_on`` starts ``waiting`` (``attempt = 0``) unless all its
dependencies are already done. A job whose function returned while children it spawned are
unfinished also waits (``attempt > 0``: it has run), holding no worker and no lock, until the
last child of its final attempt ends; it is then *finalized*: done if every such child is done,
error if one ended error, cancelled if one was cancelled.

When a job's attempt ends, :class:`Settling` does what follows from it, each step a short
statement of its own:

- done: promote waiting dependents whose dependencies are now all done;
- error or cancelled (for good): cancel every job downstream of it, transitively, naming it;
- ended without success (retried, error, cancelled): cancel the unfinished children that the
  attempt spawned, and their descendants, so that they do not keep running;
- in any final state: try to finalize its parent, and settle the parent in turn.

These run *after* the job's own state change has committed, in separate transactions. That
ordering is what makes two dependencies (or two children) that end at the same instant on
different workers safe: whichever commits last sees the other's result, so the dependent is
promoted (or the parent finalized) at least once, and the ``WHERE state = 'waiting'`` guard makes
it at most once. If a process dies midway, :func:`repair` (run by the reaper) finds and settles
what was left: the progress is the rows' own states, so there is nothing else to lose.

Every statement here locks a small batch of rows (``BATCH``), with ``SKIP LOCKED`` (and the
bounded waits of db.py), and comes back later for the rows it skipped. The steps can run a
slice at a time (``Settling.run(until=...)``), so that a worker settling a million dependents
goes on sending heartbeats and running jobs in between.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

from django_jobs import db, transitions
from django_jobs.states import (
    ACTIVE_STATES,
    CANCEL,
    CANCEL_DEPENDENTS,
    FINALIZE_PARENT,
    PROMOTE,
    QUEUED_STATES,
    SETTLE_NEW,
    TERMINAL_STATES,
    UNSUCCESSFUL_STATES,
    State,
    sql_in,
)

logger = logging.getLogger("django_jobs.workflows")

JOB = "django_jobs_job"
DEP = "django_jobs_dependency"

#: How many jobs one statement of a cascade locks at most.
BATCH = 100
#: A step that skipped rows because another transaction held them comes back for them this many
#: times, waiting longer each time; what is still held then is left to whoever holds it, and to
#: the reaper's repair pass.
SKIPPED_RETRIES = transitions.BUSY_RETRIES
SKIPPED_PAUSE = transitions.BUSY_PAUSE

# Dependents of one job, a page at a time (keyset on job_id): those waiting are locked, SKIP
# LOCKED, and promoted if their every dependency is done. Returns the page's last key, how
# many were promoted, and how many were skipped (locked by another transaction).
# Index: dependency_depends_on_idx (depends_on_id, job_id); the primary key; dependency_unique
# (job_id, ...) for the other dependencies of each.
_PROMOTE = PROMOTE.statement(f"""
WITH page AS (
    SELECT d.job_id FROM {DEP} d
    WHERE d.depends_on_id = %(job_id)s AND d.job_id > %(after)s
    ORDER BY d.job_id LIMIT %(batch)s
), candidates AS (
    -- One primary-key lookup per row of the page, whatever the statistics say: a hash join
    -- with every waiting job would make each page cost as much as the whole cascade.
    SELECT w.id FROM page CROSS JOIN LATERAL (
        SELECT id FROM {JOB} w
        WHERE w.id = page.job_id AND {PROMOTE.guard("w")} AND w.attempt = 0 OFFSET 0
    ) w
), locked AS (
    SELECT w.id FROM {JOB} w WHERE w.id IN (SELECT id FROM candidates)
    FOR NO KEY UPDATE SKIP LOCKED
), promoted AS (
    UPDATE {JOB} w SET state = 'pending', run_after = GREATEST(w.run_after, now())
    FROM locked
    WHERE w.id = locked.id AND {PROMOTE.guard("w")} AND w.attempt = 0
      AND NOT EXISTS (
          SELECT 1 FROM {DEP} d2 JOIN {JOB} dj ON dj.id = d2.depends_on_id
          WHERE d2.job_id = w.id AND dj.state <> 'done'
      )
    RETURNING w.id, (CASE WHEN w.run_after <= now()
                          THEN pg_notify('{db.CHANNEL}', w.queue) END) IS NULL
)
SELECT (SELECT max(job_id) FROM page), (SELECT count(*) FROM promoted),
       (SELECT count(*) FROM candidates) - (SELECT count(*) FROM locked)
""")

# Waiting or pending dependents of one job, a page at a time, locked SKIP LOCKED and cancelled
# with a reason that names the upstream job where the failure started. The first row has the
# page's last key and the number skipped; then one row per job cancelled, with its parent.
# Index: dependency_depends_on_idx; the primary key.
_CANCEL_DEPENDENTS = CANCEL_DEPENDENTS.statement(f"""
WITH page AS (
    SELECT d.job_id FROM {DEP} d
    WHERE d.depends_on_id = %(job_id)s AND d.job_id > %(after)s
    ORDER BY d.job_id LIMIT %(batch)s
), candidates AS (
    SELECT w.id FROM page CROSS JOIN LATERAL (
        SELECT id FROM {JOB} w
        WHERE w.id = page.job_id AND {CANCEL_DEPENDENTS.guard("w")} OFFSET 0
    ) w
), locked AS (
    SELECT w.id FROM {JOB} w WHERE w.id IN (SELECT id FROM candidates)
    FOR NO KEY UPDATE SKIP LOCKED
), cancelled AS (
    UPDATE {JOB} w SET state = 'cancelled', finished_at = now(), error = %(reason)s
    FROM locked
    WHERE w.id = locked.id AND {CANCEL_DEPENDENTS.guard("w")}
    RETURNING w.id, w.parent_id
)
SELECT (SELECT max(job_id) FROM page), (SELECT count(*) FROM candidates)
       - (SELECT count(*) FROM locked), NULL::bigint, NULL::bigint
UNION ALL
SELECT NULL, NULL, id, parent_id FROM cancelled
""")

# Unfinished children of one job, a page at a time, locked SKIP LOCKED and cancelled: pending
# and waiting ones at once, running ones asked to stop (their workers stop them within a
# heartbeat interval). With an ``attempt``, only the children that attempt spawned (and, if
# ``final``, those whose attempt was not recorded). Rows as in _CANCEL_DEPENDENTS.
# Index: job_parent_idx.
_CANCEL_CHILDREN = CANCEL.statement(f"""
WITH page AS (
    SELECT c.id FROM {JOB} c
    WHERE c.parent_id = %(job_id)s AND c.id > %(after)s AND {CANCEL.guard("c")}
      AND (%(attempt)s::int IS NULL OR c.parent_attempt = %(attempt)s
           OR (c.parent_attempt IS NULL AND %(final)s))
    ORDER BY c.id LIMIT %(batch)s
), locked AS (
    SELECT c.id FROM {JOB} c WHERE c.id IN (SELECT id FROM page)
    FOR NO KEY UPDATE SKIP LOCKED
), changed AS (
    UPDATE {JOB} j SET {transitions.CANCEL_SET}
    FROM locked
    WHERE j.id = locked.id AND {CANCEL.guard("j")}
    RETURNING j.id, j.parent_id
)
SELECT (SELECT max(id) FROM page), (SELECT count(*) FROM page) - (SELECT count(*) FROM locked),
       NULL::bigint, NULL::bigint
UNION ALL
SELECT NULL, NULL, id, parent_id FROM changed
""")

# Finalize a parent that is waiting for children, once none is active. Only the children of
# its final attempt count (parent_attempt; NULL for children made before it was recorded): an
# earlier attempt's children were cancelled when that attempt failed. The aggregate over the
# children runs only if the parent qualifies. Index: job_parent_idx.
_FINALIZE_PARENT = FINALIZE_PARENT.statement(f"""
WITH ready AS (
    SELECT p.id, p.attempt FROM {JOB} p
    WHERE p.id = %(job_id)s AND {FINALIZE_PARENT.guard("p")} AND p.attempt > 0
      AND NOT EXISTS (
          SELECT 1 FROM {JOB} c
          WHERE c.parent_id = p.id AND c.state IN {sql_in(ACTIVE_STATES)}
            AND (c.parent_attempt IS NULL OR c.parent_attempt = p.attempt)
      )
), kids AS (
    SELECT min(c.id) FILTER (WHERE c.state = 'error') AS first_error,
           min(c.id) FILTER (WHERE c.state = 'cancelled') AS first_cancelled
    FROM {JOB} c JOIN ready r ON c.parent_id = r.id
    WHERE c.parent_attempt IS NULL OR c.parent_attempt = r.attempt
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
WHERE p.id = ready.id AND {FINALIZE_PARENT.guard("p")}
RETURNING p.state
""")


# New waiting dependents, checked again once the transaction that enqueued them has committed
# (see enqueue.py): promoted if every dependency is done by now, cancelled if one ended in error
# or was cancelled. FOR SHARE on the dependencies waits for a finish that is in flight (it holds
# its row FOR NO KEY UPDATE) and sees its outcome; the lock lasts this statement only. A bounded
# batch of the new jobs, locked SKIP LOCKED; the ids of those that were skipped come back, for
# another try. Index: the primary key; dependency_unique (job_id, depends_on_id) for the links.
_SETTLE_NEW = SETTLE_NEW.statement(f"""
WITH upstream AS (
    SELECT dj.id, dj.state, dj.task FROM {JOB} dj
    WHERE dj.id IN (SELECT d.depends_on_id FROM {DEP} d WHERE d.job_id = ANY(%(ids)s))
    FOR SHARE OF dj
), targets AS (
    SELECT w.id FROM {JOB} w
    WHERE w.id = ANY(%(ids)s) AND {SETTLE_NEW.guard("w")} AND w.attempt = 0
    FOR NO KEY UPDATE OF w SKIP LOCKED
), verdicts AS (
    SELECT t.id, bool_and(u.state = 'done') AS all_done,
           min(u.id) FILTER (WHERE u.state IN {sql_in(UNSUCCESSFUL_STATES)}) AS failed
    FROM targets t
    JOIN {DEP} d ON d.job_id = t.id
    JOIN upstream u ON u.id = d.depends_on_id
    GROUP BY t.id
), changed AS (
    UPDATE {JOB} w
    SET state = CASE WHEN v.failed IS NULL THEN 'pending' ELSE 'cancelled' END,
        run_after = CASE WHEN v.failed IS NULL THEN GREATEST(w.run_after, now())
                         ELSE w.run_after END,
        finished_at = CASE WHEN v.failed IS NULL THEN NULL ELSE now() END,
        error = CASE WHEN v.failed IS NULL THEN w.error
                     ELSE 'cancelled: upstream job #' || u.id || ' (' || u.task || ') ended '
                          || u.state END
    FROM verdicts v LEFT JOIN upstream u ON u.id = v.failed
    WHERE w.id = v.id AND (v.all_done OR v.failed IS NOT NULL)
    RETURNING w.id, w.state,
              (CASE WHEN w.state = 'pending' AND w.run_after <= now()
                    THEN pg_notify('{db.CHANNEL}', w.queue) END) IS NULL
)
SELECT id, state FROM changed
UNION ALL
SELECT w.id, 'skipped' FROM {JOB} w
WHERE w.id = ANY(%(ids)s) AND {SETTLE_NEW.guard("w")} AND w.attempt = 0
  AND w.id NOT IN (SELECT id FROM targets)
""")


def settle_new_dependents(cursor: Any, job_ids: Sequence[int]) -> dict[str, int]:
    """Promote or cancel just-enqueued waiting jobs whose dependencies ended meanwhile (see
    above); returns how many went each way."""
    counts = {"pending": 0, "cancelled": 0, "skipped": 0}
    todo = list(job_ids)
    for attempt in range(SKIPPED_RETRIES + 1):
        skipped: list[int] = []
        for start in range(0, len(todo), BATCH):
            batch = todo[start : start + BATCH]
            for job_id, state in db.execute(cursor, _SETTLE_NEW, {"ids": batch}).fetchall():
                if state == "skipped":
                    skipped.append(job_id)
                    continue
                counts[state] += 1
                if state == "cancelled":
                    settle(cursor, job_id)  # its parent, if any
        if not skipped:
            return counts
        todo = skipped
        if attempt < SKIPPED_RETRIES:
            time.sleep(SKIPPED_PAUSE)
    counts["skipped"] = len(todo)
    logger.warning(
        "%d new waiting job(s) were locked by another transaction; the reaper's repair pass"
        " settles them if their holder does not",
        len(todo),
    )
    return counts


# Jobs a crash may have left unsettled: waiting with nothing left to wait for. Index: a scan of
# waiting jobs (few, normally), with the same subqueries as above per row.
_UNSETTLED = f"""
SELECT w.id FROM {JOB} w
WHERE w.state = 'waiting' AND (
    (w.attempt > 0 AND NOT EXISTS (
        SELECT 1 FROM {JOB} c WHERE c.parent_id = w.id AND c.state IN {sql_in(ACTIVE_STATES)}
          AND (c.parent_attempt IS NULL OR c.parent_attempt = w.attempt)))
    OR (w.attempt = 0 AND NOT EXISTS (
        SELECT 1 FROM {DEP} d JOIN {JOB} dj ON dj.id = d.depends_on_id
        WHERE d.job_id = w.id AND dj.state <> 'done'))
    OR (w.attempt = 0 AND EXISTS (
        SELECT 1 FROM {DEP} d JOIN {JOB} dj ON dj.id = d.depends_on_id
        WHERE d.job_id = w.id AND dj.state IN {sql_in(UNSUCCESSFUL_STATES)}))
)
ORDER BY w.id
LIMIT %(limit)s
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


#: A job in one of these states, past its first attempt, has had an attempt that did not succeed
#: (it is pending again for a retry, or ended for good): that attempt's children must not run.
_ATTEMPT_DID_NOT_SUCCEED = frozenset({State.PENDING, *UNSUCCESSFUL_STATES})

# A step of the settling: a tuple whose first item names what to do (see Settling._step).
Step = tuple[Any, ...]


class Settling:
    """What follows from some jobs' ends, as a queue of small steps (see the module's
    docstring). Each step runs one statement and may queue more steps; a step that skipped
    locked rows comes back later."""

    def __init__(self, steps: Sequence[Step] = ()) -> None:
        self.todo: deque[Step] = deque(steps)
        # Steps to run again at a monotonic time, with how often they have skipped rows.
        self.later: list[tuple[float, int, Step]] = []
        self.statements = 0

    @classmethod
    def of(cls, *job_ids: int) -> Settling:
        return cls([("settle", job_id) for job_id in job_ids])

    @property
    def finished(self) -> bool:
        return not self.todo and not self.later

    def next_due(self) -> float:
        """When the next step can run (monotonic): now, or when a skipped step is due."""
        if self.todo or not self.later:
            return time.monotonic()
        return min(due for due, _, _ in self.later)

    def run(self, cursor: Any, *, until: float | None = None) -> None:
        """Run the steps that are due, until none is, or the monotonic ``until`` has passed."""
        while True:
            now = time.monotonic()
            due = [entry for entry in self.later if entry[0] <= now]
            for entry in due:
                self.later.remove(entry)
                self.todo.append((*entry[2], entry[1]))
            if not self.todo or (until is not None and now >= until):
                return
            # Taken off the queue only once it has run: a step whose statement failed (a lock
            # wait that ran out, an outage) is tried again by the next run.
            self._step(cursor, self.todo[0])
            self.todo.popleft()

    def run_to_end(self, cursor: Any) -> None:
        """Run every step, waiting for the ones that skipped locked rows."""
        while not self.finished:
            self.run(cursor)
            if self.later:
                time.sleep(max(0.0, self.next_due() - time.monotonic()))

    # ------------------------------------------------------------------ the steps

    def _step(self, cursor: Any, step: Step) -> None:
        self.statements += 1
        kind = step[0]
        if kind == "settle":
            self._settle(cursor, step[1])
        elif kind == "promote":
            _, job_id, after, *tries = step
            last, _count, skipped = db.execute(
                cursor, _PROMOTE, {"job_id": job_id, "after": after, "batch": BATCH}
            ).fetchone()
            self._paged(step, last, skipped, tries)
        elif kind == "cancel_dependents":
            _, job_id, reason, after, *tries = step
            params = {"job_id": job_id, "after": after, "batch": BATCH, "reason": reason}
            rows = db.execute(cursor, _CANCEL_DEPENDENTS, params).fetchall()
            for _, _, changed_id, parent_id in rows[1:]:
                self.todo.append(("cancel_dependents", changed_id, reason, 0))
                if parent_id is not None:
                    self.todo.append(("settle", parent_id))
            self._paged(step, rows[0][0], rows[0][1], tries)
        elif kind == "cancel_children":
            _, job_id, attempt, final, reason, after, *tries = step
            params = {
                "job_id": job_id,
                "attempt": attempt,
                "final": final,
                "after": after,
                "batch": BATCH,
                "reason": reason,
            }
            rows = db.execute(cursor, _CANCEL_CHILDREN, params).fetchall()
            for _, _, changed_id, _parent in rows[1:]:
                descendants = f"cancelled: ancestor job #{changed_id} was cancelled"
                self.todo.append(("cancel_children", changed_id, None, True, descendants, 0))
                self.todo.append(("settle", changed_id))
            self._paged(step, rows[0][0], rows[0][1], tries)
        else:
            raise ValueError(f"unknown settling step {step!r}")

    def _paged(self, step: Step, last: int | None, skipped: int, tries: list[int]) -> None:
        """After one page of a paged step: queue the next page, and come back later for this
        one if rows were skipped."""
        base = _without_tries(step)
        if last is not None:
            self.todo.append((*base[:-1], last))
        if skipped:
            attempts = (tries[0] if tries else 0) + 1
            if attempts > SKIPPED_RETRIES:
                logger.warning(
                    "%s: %d job(s) stayed locked by another transaction; leaving them to it and"
                    " to the reaper's repair pass",
                    base[0],
                    skipped,
                )
                return
            self.later.append((time.monotonic() + SKIPPED_PAUSE * attempts, attempts, base))

    def _settle(self, cursor: Any, job_id: int) -> None:
        row = _job(cursor, job_id)
        if row is None:
            return
        state, parent_id, attempt, task = row
        if state in _ATTEMPT_DID_NOT_SUCCEED and attempt > 0:
            # The attempt ended without success: its children must not keep running.
            reason = f"cancelled: attempt {attempt} of parent job #{job_id} did not succeed"
            final = state in UNSUCCESSFUL_STATES
            self.todo.append(("cancel_children", job_id, attempt, final, reason, 0))
        if state == State.WAITING and attempt > 0:
            if finalize_parent(cursor, job_id) is not None:
                self.todo.append(("settle", job_id))  # now final: its dependents and parent
            return
        if state not in TERMINAL_STATES:
            return
        if state == State.DONE:
            self.todo.append(("promote", job_id, 0))
        else:
            reason = f"cancelled: upstream job #{job_id} ({task}) ended {state}"
            self.todo.append(("cancel_dependents", job_id, reason, 0))
        if parent_id is not None:
            self.todo.append(("settle", parent_id))


def _without_tries(step: Step) -> Step:
    """A paged step as queued, without the retry count that a come-back appends."""
    lengths = {"promote": 3, "cancel_dependents": 4, "cancel_children": 6}
    return step[: lengths[step[0]]]


def settle(cursor: Any, job_id: int) -> None:
    """Do everything that follows from ``job_id``'s state (see above), to the end."""
    Settling.of(job_id).run_to_end(cursor)


def cancel_with_cascade(
    cursor: Any, ids: Sequence[int], reason: str = "cancelled"
) -> list[transitions.Cancelled]:
    """Cancel jobs and everything hanging off them.

    Each job: pending or waiting ends at once, running is asked to stop (its worker stops it
    within a heartbeat interval). Its descendants likewise. Its dependents, transitively, are
    cancelled once it has ended. Returns :class:`~django_jobs.transitions.Cancelled` entries for
    the jobs named in ``ids`` that changed.
    """
    return transitions.until_free(
        lambda batch: cancel_batch_with_cascade(cursor, batch, reason), ids
    ).changed


def cancel_batch_with_cascade(
    cursor: Any, ids: Sequence[int], reason: str = "cancelled"
) -> transitions.Changes:
    """:func:`cancel_with_cascade` for one small batch, without coming back for the jobs another
    transaction held (they are ``busy`` in the result)."""
    changes = transitions.cancel_without_cascade(cursor, ids, reason)
    settling = Settling()
    for entry in changes.changed:
        if entry.linked:
            descendants = f"cancelled: ancestor job #{entry.job_id} was cancelled"
            settling.todo.append(("cancel_children", entry.job_id, None, True, descendants, 0))
            if entry.state == State.CANCELLED:
                settling.todo.append(("settle", entry.job_id))
    settling.run_to_end(cursor)
    return changes


# Children that a crash may have left running after their parent's attempt failed: active
# children of an attempt that is over (the parent has ended for good, or is on a later attempt).
# Index: job_parent_idx, from the parents' side.
_STRAY_CHILDREN = f"""
SELECT DISTINCT p.id, p.attempt, p.state FROM {JOB} p
JOIN {JOB} c ON c.parent_id = p.id
WHERE c.state IN {sql_in(QUEUED_STATES)} AND c.parent_attempt IS NOT NULL
  AND (p.state IN {sql_in(UNSUCCESSFUL_STATES)}
       OR c.parent_attempt < p.attempt
       OR (p.state = 'pending' AND c.parent_attempt = p.attempt))
ORDER BY p.id
LIMIT %(limit)s
"""


def repair(cursor: Any, limit: int = 1000) -> list[int]:
    """Settle what a crash left unsettled: waiting jobs with nothing left to wait for, and
    children of attempts that did not succeed. Returns the ids of the jobs it looked at."""
    stuck = [row[0] for row in db.execute(cursor, _UNSETTLED, {"limit": limit}).fetchall()]
    settling = Settling()
    for job_id in stuck:
        row = _job(cursor, job_id)
        if row is None or row[0] != State.WAITING:
            continue
        if row[2] > 0:
            settling.todo.append(("settle", job_id))
            continue
        # A dependency-waiting job: settle the dependencies, which promotes or cancels it.
        for (upstream,) in db.execute(
            cursor, f"SELECT depends_on_id FROM {DEP} WHERE job_id = %s", [job_id]
        ).fetchall():
            settling.todo.append(("settle", upstream))
    for parent_id, attempt, state in db.execute(
        cursor, _STRAY_CHILDREN, {"limit": limit}
    ).fetchall():
        stuck.append(parent_id)
        for number in range(1, attempt + 1):
            last = number == attempt
            if last and state not in _ATTEMPT_DID_NOT_SUCCEED:
                continue  # the children of the attempt that runs, or that the job waits for
            final = last and state in UNSUCCESSFUL_STATES
            reason = f"cancelled: attempt {number} of parent job #{parent_id} did not succeed"
            settling.todo.append(("cancel_children", parent_id, number, final, reason, 0))
    settling.run_to_end(cursor)
    return stuck
