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

Every statement here (django_jobs/store/sql/workflows.sql) locks a small batch of rows (``BATCH``),
with ``SKIP LOCKED`` (and the bounded waits of db.py), and comes back later for the rows it
skipped. The steps can run a slice at a time (``Settling.run(until=...)``), so that a worker
settling a million dependents goes on sending heartbeats and running jobs in between.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Sequence
from typing import Any, NamedTuple

from django_jobs import store
from django_jobs.cursor import Cursor
from django_jobs.states import TERMINAL_STATES, UNSUCCESSFUL_STATES, State
from django_jobs.store import db
from django_jobs.store.sql import query

logger = logging.getLogger("django_jobs.workflows")

#: How many jobs one statement of a cascade locks at most.
BATCH = 100
#: A step that skipped rows because another transaction held them comes back for them this many
#: times, waiting longer each time; what is still held then is left to whoever holds it, and to
#: the reaper's repair pass.
SKIPPED_RETRIES = store.BUSY_RETRIES
SKIPPED_PAUSE = store.BUSY_PAUSE


class _Settled(NamedTuple):
    id: int
    #: pending, cancelled, or skipped (another transaction held it).
    state: str


def settle_new_dependents(cursor: Cursor, job_ids: Sequence[int]) -> dict[str, int]:
    """Promote or cancel just-enqueued waiting jobs whose dependencies ended meanwhile
    (``settle_new`` in workflows.sql); returns how many went each way."""
    counts = {"pending": 0, "cancelled": 0, "skipped": 0}
    todo = list(job_ids)
    for attempt in range(SKIPPED_RETRIES + 1):
        skipped: list[int] = []
        for start in range(0, len(todo), BATCH):
            batch = todo[start : start + BATCH]
            result = db.execute(cursor, query("settle_new"), {"ids": batch})
            for row in db.fetch_all_as(result, _Settled):
                if row.state == "skipped":
                    skipped.append(row.id)
                    continue
                counts[row.state] += 1
                if row.state == "cancelled":
                    settle(cursor, row.id)  # its parent, if any
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


class _JobToSettle(NamedTuple):
    state: str
    parent_id: int | None
    attempt: int
    task: str


def _job(cursor: Cursor, job_id: int) -> _JobToSettle | None:
    result = db.execute(cursor, query("job_to_settle"), {"job_id": job_id})
    return db.fetch_one_as(result, _JobToSettle)


class _Finalized(NamedTuple):
    state: str


def finalize_parent(cursor: Cursor, job_id: int) -> str | None:
    """Finalize ``job_id`` if it waits for children and none is active; return its new state."""
    result = db.execute(cursor, query("finalize_parent"), {"job_id": job_id})
    row = db.fetch_one_as(result, _Finalized)
    if row is None:
        return None
    logger.info(
        "job %d finalized %s: its children have finished",
        job_id,
        row.state,
        extra={"job_id": job_id, "state": row.state},
    )
    return row.state


#: A job in one of these states, past its first attempt, has had an attempt that did not succeed
#: (it is pending again for a retry, or ended for good): that attempt's children must not run.
_ATTEMPT_DID_NOT_SUCCEED = frozenset({State.PENDING, *UNSUCCESSFUL_STATES})

# A step of the settling: a tuple whose first item names what to do (see Settling._step).
Step = tuple[Any, ...]


class _Promoted(NamedTuple):
    """A page of ``promote``: the last dependent it read (None: no more), how many it promoted,
    how many another transaction held."""

    last: int | None
    promoted: int
    skipped: int


class _CancelledRow(NamedTuple):
    """A row of a page of ``cancel_dependents`` or ``cancel_children``: the first is the page's
    (``last``, ``skipped``), each other a job it cancelled (``changed_id``, ``parent_id``)."""

    last: int | None
    skipped: int | None
    changed_id: int | None
    parent_id: int | None


def _cancelled_page(cursor: Cursor, name: str, params: dict[str, Any]) -> list[_CancelledRow]:
    return db.fetch_all_as(db.execute(cursor, query(name), params), _CancelledRow)


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

    def run(self, cursor: Cursor, *, until: float | None = None) -> None:
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

    def run_to_end(self, cursor: Cursor) -> None:
        """Run every step, waiting for the ones that skipped locked rows."""
        while not self.finished:
            self.run(cursor)
            if self.later:
                time.sleep(max(0.0, self.next_due() - time.monotonic()))

    # ------------------------------------------------------------------ the steps

    def _step(self, cursor: Cursor, step: Step) -> None:
        self.statements += 1
        kind = step[0]
        if kind == "settle":
            self._settle(cursor, step[1])
        elif kind == "promote":
            _, job_id, after, *tries = step
            params = {"job_id": job_id, "after": after, "batch": BATCH}
            promoted = db.fetch_one_as(db.execute(cursor, query("promote"), params), _Promoted)
            assert promoted is not None  # a statement of counts has one row
            self._paged(step, promoted.last, promoted.skipped, tries)
        elif kind == "cancel_dependents":
            _, job_id, reason, after, *tries = step
            params = {"job_id": job_id, "after": after, "batch": BATCH, "reason": reason}
            page, *changed = _cancelled_page(cursor, "cancel_dependents", params)
            for row in changed:
                self.todo.append(("cancel_dependents", row.changed_id, reason, 0))
                if row.parent_id is not None:
                    self.todo.append(("settle", row.parent_id))
            self._paged(step, page.last, page.skipped or 0, tries)
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
            page, *changed = _cancelled_page(cursor, "cancel_children", params)
            for row in changed:
                descendants = f"cancelled: ancestor job #{row.changed_id} was cancelled"
                self.todo.append(("cancel_children", row.changed_id, None, True, descendants, 0))
                self.todo.append(("settle", row.changed_id))
            self._paged(step, page.last, page.skipped or 0, tries)
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

    def _settle(self, cursor: Cursor, job_id: int) -> None:
        job = _job(cursor, job_id)
        if job is None:
            return
        state, parent_id, attempt, task = job.state, job.parent_id, job.attempt, job.task
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


def settle(cursor: Cursor, job_id: int) -> None:
    """Do everything that follows from ``job_id``'s state (see above), to the end."""
    Settling.of(job_id).run_to_end(cursor)


def cancel_with_cascade(
    cursor: Cursor, ids: Sequence[int], reason: str = "cancelled"
) -> list[store.Cancelled]:
    """Cancel jobs and everything hanging off them.

    Each job: pending or waiting ends at once, running is asked to stop (its worker stops it
    within a heartbeat interval). Its descendants likewise. Its dependents, transitively, are
    cancelled once it has ended. Returns :class:`~django_jobs.store.Cancelled` entries for
    the jobs named in ``ids`` that changed.
    """
    return store.until_free(
        lambda batch: cancel_batch_with_cascade(cursor, batch, reason), ids
    ).changed


def cancel_batch_with_cascade(
    cursor: Cursor, ids: Sequence[int], reason: str = "cancelled"
) -> store.Changes:
    """:func:`cancel_with_cascade` for one small batch, without coming back for the jobs another
    transaction held (they are ``busy`` in the result)."""
    changes = store.cancel_without_cascade(cursor, ids, reason)
    _cascade(cursor, changes)
    return changes


def _cascade(cursor: Cursor, changes: store.Changes) -> None:
    """What follows from the cancellation of ``changes``' jobs: their descendants are
    cancelled, and the dependents of those that ended."""
    settling = Settling()
    for entry in changes.changed:
        if entry.linked:
            descendants = f"cancelled: ancestor job #{entry.job_id} was cancelled"
            settling.todo.append(("cancel_children", entry.job_id, None, True, descendants, 0))
            if entry.state == State.CANCELLED:
                settling.todo.append(("settle", entry.job_id))
    settling.run_to_end(cursor)


def expire_due(cursor: Cursor, limit: int = store.EXPIRE_BATCH) -> list[int]:
    """End pending jobs whose deadline (``expires_at``) has passed, cancelled as expired, and
    cancel their dependents as for any cancelled dependency: a batch of at most ``limit``.
    Returns the ids ended."""
    changes = store.expire_due(cursor, limit)
    _cascade(cursor, changes)
    return [entry.job_id for entry in changes.changed]


class _Unsettled(NamedTuple):
    id: int


class _WaitingDependent(NamedTuple):
    id: int
    unsettled: bool


class _Upstream(NamedTuple):
    depends_on_id: int


class _StrayParent(NamedTuple):
    parent_id: int
    attempt: int
    state: str


#: How many jobs waiting for dependencies one repair pass looks at (a page, in id order): a pass
#: costs this page, however many jobs wait. With more waiting than that, the next passes go on
#: where this one stopped, so each waiting job is looked at once every ``waiting / REPAIR_PAGE``
#: passes.
REPAIR_PAGE = 500


class _Sweep:
    """Where the repair's walk through waiting dependents stands: the last id it looked at (0:
    from the start). Kept by the process; a new one starts from the first waiting job."""

    after: int = 0


_sweep = _Sweep()


def _waiting_dependents(cursor: Cursor, page: int) -> list[_WaitingDependent]:
    """The next ``page`` jobs waiting for dependencies after where the sweep stands, going on
    from the first one when it reaches the last (each at most once a call)."""
    start = _sweep.after
    params = {"after": start, "until": None, "limit": page}
    rows = db.fetch_all_as(
        db.execute(cursor, query("unsettled_dependents"), params), _WaitingDependent
    )
    if len(rows) < page and start > 0:
        params = {"after": 0, "until": start, "limit": page - len(rows)}
        more = db.execute(cursor, query("unsettled_dependents"), params)
        wrapped = db.fetch_all_as(more, _WaitingDependent)
        rows += wrapped
        _sweep.after = wrapped[-1].id if len(wrapped) == params["limit"] else 0
    else:
        _sweep.after = rows[-1].id if len(rows) == page else 0
    return rows


def repair(cursor: Cursor, limit: int = 1000, page: int = REPAIR_PAGE) -> list[int]:
    """Settle what a crash left unsettled: waiting parents with no active child left (up to
    ``limit``), waiting dependents with nothing left to wait for (looked for in a page of
    ``page`` of them, see :data:`REPAIR_PAGE`), and children of attempts that did not succeed
    (up to ``limit``). Returns the ids of the jobs it looked at."""
    unsettled = db.execute(cursor, query("unsettled_parents"), {"limit": limit})
    stuck = [row.id for row in db.fetch_all_as(unsettled, _Unsettled)]
    stuck += sorted(row.id for row in _waiting_dependents(cursor, page) if row.unsettled)
    settling = Settling()
    for job_id in stuck:
        job = _job(cursor, job_id)
        if job is None or job.state != State.WAITING:
            continue
        if job.attempt > 0:
            settling.todo.append(("settle", job_id))
            continue
        # A dependency-waiting job: settle the dependencies, which promotes or cancels it.
        upstreams = db.execute(cursor, query("dependencies_of"), {"job_id": job_id})
        for upstream in db.fetch_all_as(upstreams, _Upstream):
            settling.todo.append(("settle", upstream.depends_on_id))
    strays = db.execute(cursor, query("stray_children"), {"limit": limit})
    for stray in db.fetch_all_as(strays, _StrayParent):
        stuck.append(stray.parent_id)
        for number in range(1, stray.attempt + 1):
            last = number == stray.attempt
            if last and stray.state not in _ATTEMPT_DID_NOT_SUCCEED:
                continue  # the children of the attempt that runs, or that the job waits for
            final = last and stray.state in UNSUCCESSFUL_STATES
            reason = f"cancelled: attempt {number} of parent job #{stray.parent_id} did not succeed"
            settling.todo.append(("cancel_children", stray.parent_id, number, final, reason, 0))
    settling.run_to_end(cursor)
    return stuck
