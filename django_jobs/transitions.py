"""The hot SQL: claim, finish, release, heartbeat, cancel.

Each function runs one statement, which PostgreSQL runs as one short transaction when the
connection is in autocommit mode; the statement locks at most one job row, for milliseconds, and
commits durably (see db.py). Every write to a claimed job is *fenced*: it matches
``state = 'running'`` together with the claim's *lease*, a random token that the claim stores on
the job and its attempt row, so a worker whose job was reaped and re-run cannot overwrite the new
run. Attempt numbers alone would not do: a server crash that lost a claim would hand the same
number out again, while a token is never handed out twice. A fenced write that matches no row
means "lease lost": callers log it.

Functions take a DB-API cursor (a Django cursor or a psycopg one), so the worker can use its own
connection and the admin or the reaper can use Django's.
"""

from __future__ import annotations

import dataclasses
import datetime
import time
from collections.abc import Callable, Sequence
from typing import Any

from django_jobs import db
from django_jobs.states import (
    ACTIVE_STATES,
    CANCEL,
    CLAIM,
    END_ATTEMPT,
    RELEASE,
    RETRY,
    RUN_NOW,
    TERMINAL_STATES,
    Outcome,
    State,
    sql_in,
)

JOB = "django_jobs_job"
ATTEMPT = "django_jobs_attempt"


@dataclasses.dataclass(frozen=True)
class Lease:
    """What identifies one claim of a job; every later write is fenced on it."""

    job_id: int
    attempt: int
    worker_id: str
    #: The claim's random token (``None`` only for rows claimed before tokens existed).
    token: str | None


def _lease_params(lease: Lease) -> dict[str, Any]:
    return {
        "job_id": lease.job_id,
        "attempt": lease.attempt,
        "worker_id": lease.worker_id,
        "lease": lease.token,
    }


@dataclasses.dataclass(frozen=True)
class ClaimedJob:
    lease: Lease
    attempt_id: int
    task: str
    queue: str
    args_json: str
    kwargs_json: str
    max_attempts: int
    timeout: int | None
    parent_id: int | None

    @property
    def id(self) -> int:
        return self.lease.job_id

    @property
    def attempt(self) -> int:
        return self.lease.attempt


# Claim: pick the first ready pending job in (priority DESC, run_after, id) order, lock it with
# SKIP LOCKED so concurrent workers pass over each other, mark it running, count the attempt and
# draw a new lease token, and open its Attempt row: one statement, one round trip.
# The lock is FOR NO KEY UPDATE, the mode the UPDATE takes anyway: it excludes other claims and
# finishes of the job, but not the FOR KEY SHARE that a foreign key check takes on it while a
# dependent or a child of the job is being enqueued in a transaction that may stay open.
# Index: job_claim_idx (any queue) or job_claim_queue_idx (one queue); both are partial on
# state = 'pending', so finished jobs cost nothing however many there are.
_CLAIM = CLAIM.statement(f"""
WITH claimed AS (
    UPDATE {JOB} SET state = 'running', attempt = attempt + 1, worker_id = %(worker_id)s,
                     started_at = now(), finished_at = NULL, cancel_requested = false,
                     lease = gen_random_uuid()
    WHERE id = (
        SELECT id FROM {JOB}
        WHERE {CLAIM.guard()} AND run_after <= now() {{queue_filter}}
          AND (%(skip_tasks)s::text[] IS NULL OR task <> ALL(%(skip_tasks)s::text[]))
        ORDER BY priority DESC, run_after, id
        LIMIT 1
        FOR NO KEY UPDATE SKIP LOCKED
    ) AND {CLAIM.guard()}
    RETURNING id, task, queue, args::text, kwargs::text, attempt, max_attempts, timeout,
              parent_id, lease
), opened AS (
    INSERT INTO {ATTEMPT} (job_id, number, worker_id, started_at, outcome, error, traceback,
                           lease)
    SELECT id, attempt, %(worker_id)s, now(), 'running', '', '', lease FROM claimed
    RETURNING id
)
SELECT claimed.*, opened.id FROM claimed, opened
""")
_CLAIM_ANY_QUEUE = _CLAIM.format(queue_filter="")
_CLAIM_ONE_QUEUE = _CLAIM.format(queue_filter="AND queue = %(queue)s")
_CLAIM_SOME_QUEUES = _CLAIM.format(queue_filter="AND queue = ANY(%(queues)s)")


def claim_sql(queues: Sequence[str] | None) -> tuple[str, dict[str, Any]]:
    """The claim statement for a worker serving ``queues`` (``None``: every queue)."""
    if not queues:
        return _CLAIM_ANY_QUEUE, {"skip_tasks": None}
    if len(queues) == 1:
        return _CLAIM_ONE_QUEUE, {"queue": queues[0], "skip_tasks": None}
    return _CLAIM_SOME_QUEUES, {"queues": list(queues), "skip_tasks": None}


def _claimed(worker_id: str, row: Sequence[Any] | None) -> ClaimedJob | None:
    if row is None:
        return None
    (
        job_id,
        task,
        queue,
        args_json,
        kwargs_json,
        attempt,
        max_attempts,
        timeout,
        parent_id,
        *rest,
    ) = row
    token, attempt_id = rest
    return ClaimedJob(
        lease=Lease(job_id=job_id, attempt=attempt, worker_id=worker_id, token=str(token)),
        attempt_id=attempt_id,
        task=task,
        queue=queue,
        args_json=args_json,
        kwargs_json=kwargs_json,
        max_attempts=max_attempts,
        timeout=timeout,
        parent_id=parent_id,
    )


def _function_body(source: str) -> str:
    # Trailing spaces left by the statements' templates go, so that migrations can quote the
    # body as it is.
    return "\n".join(line.rstrip() for line in source.strip().splitlines()) + "\n"


# The claim runs inside a PL/pgSQL function whose body is the statement above (one branch per
# queue filter), made by migration 0007 from CLAIM_FUNCTION_BODY. PostgreSQL keeps a function's
# plans for the life of its connection, so a worker does not pay for planning the statement on
# every job, and nothing is prepared on the protocol, which pgbouncer in transaction mode would
# break. tests/test_transitions.py checks that the database's function has this body.
CLAIM_FUNCTION = "django_jobs_claim"
CLAIM_FUNCTION_BODY = _function_body(
    """
#variable_conflict use_column
BEGIN
    IF p_queues IS NULL OR cardinality(p_queues) = 0 THEN
        RETURN QUERY {any_queue};
    ELSIF cardinality(p_queues) = 1 THEN
        RETURN QUERY {one_queue};
    ELSE
        RETURN QUERY {some_queues};
    END IF;
END
""".format(
        any_queue=_CLAIM_ANY_QUEUE % {"worker_id": "p_worker_id", "skip_tasks": "p_skip_tasks"},
        one_queue=_CLAIM_ONE_QUEUE
        % {"worker_id": "p_worker_id", "queue": "p_queues[1]", "skip_tasks": "p_skip_tasks"},
        some_queues=_CLAIM_SOME_QUEUES
        % {"worker_id": "p_worker_id", "queues": "p_queues", "skip_tasks": "p_skip_tasks"},
    )
)
_CALL_CLAIM = (
    f"SELECT * FROM {CLAIM_FUNCTION}(%(worker_id)s::text, %(queues)s::text[],"
    " %(skip_tasks)s::text[])"
)


def claim(
    cursor: Any,
    worker_id: str,
    queues: Sequence[str] | None,
    skip_tasks: Sequence[str] = (),
) -> ClaimedJob | None:
    """Claim one ready job for ``worker_id``, or return ``None`` if none is ready. Jobs of
    ``skip_tasks`` (tasks the worker has found it does not have) are passed over."""
    # The commit is durable: a claim that a server crash lost would make a job that is running
    # claimable again, and a second executor would run it at the same time as the first.
    params = _claim_params(worker_id, queues, skip_tasks)
    return _claimed(worker_id, db.execute(cursor, _CALL_CLAIM, params).fetchone())


def _claim_params(
    worker_id: str, queues: Sequence[str] | None, skip_tasks: Sequence[str] = ()
) -> dict[str, Any]:
    return {
        "worker_id": worker_id,
        "queues": list(queues) if queues else None,
        "skip_tasks": list(skip_tasks) if skip_tasks else None,
    }


# Ending an attempt: finish (by the worker) and reap (by the reaper) share one statement. It is
# fenced on the lease (and locks FOR NO KEY UPDATE, as the claim does, so that a transaction
# enqueueing a dependent or a child of the job never holds it back), decides the job's next
# state in one place, and closes the attempt row:
# - success: done, or waiting if the job spawned children that are not finished yet (the parent
#   is finalized when its last child ends, see workflows.py), or cancelled if its cancellation
#   was requested meanwhile (its unfinished children are then cancelled too);
# - cancelled if cancellation was asked for;
# - pending again, after the retry delay counted from the database's now(), while attempts
#   remain and the failure is retryable;
# - error otherwise.
# It also says whether the job has a parent, dependents, or unfinished children of this
# attempt, which then need settling. A parent's outcome is decided by the children of its final
# attempt only (parent_attempt); those of an attempt that failed are cancelled by the settling.
# Index: the job's primary key; job_parent_idx for active children; attempt_job_number_idx.
_END_ATTEMPT = END_ATTEMPT.statement(f"""
WITH target AS (
    SELECT id, attempt,
           CASE
               WHEN %(outcome)s = 'done' THEN
                   CASE WHEN NOT EXISTS (
                       SELECT 1 FROM {JOB} c
                       WHERE c.parent_id = j.id AND c.state IN {sql_in(ACTIVE_STATES)}
                         AND (c.parent_attempt IS NULL OR c.parent_attempt = j.attempt)
                   ) THEN 'done'
                   WHEN cancel_requested THEN 'cancelled'
                   ELSE 'waiting' END
               WHEN cancel_requested OR %(outcome)s = 'cancelled' THEN 'cancelled'
               WHEN %(retryable)s AND attempt < max_attempts THEN 'pending'
               ELSE 'error'
           END AS new_state
    FROM {JOB} j
    WHERE id = %(job_id)s AND {END_ATTEMPT.guard()} AND attempt = %(attempt)s
      AND worker_id = %(worker_id)s AND lease IS NOT DISTINCT FROM %(lease)s::uuid {{condition}}
    FOR NO KEY UPDATE {{skip_locked}}
), job AS (
    UPDATE {JOB} j
    SET state = t.new_state,
        finished_at = CASE WHEN t.new_state IN ('pending', 'waiting') THEN NULL ELSE now() END,
        run_after = CASE WHEN t.new_state = 'pending'
                         THEN now() + make_interval(secs => %(retry_delay)s)
                         ELSE j.run_after END,
        worker_id = CASE WHEN t.new_state = 'pending' THEN NULL ELSE j.worker_id END,
        result = %(result)s::jsonb,
        error = %(error)s,
        task_missing_since = NULL
    FROM target t
    WHERE j.id = t.id
    RETURNING j.id, j.state, j.parent_id, j.attempt
), closed AS (
    UPDATE {ATTEMPT} a
    SET finished_at = now(), outcome = %(outcome)s, error = %(error)s, traceback = %(traceback)s
    FROM target t
    WHERE a.job_id = t.id AND a.number = t.attempt AND a.worker_id = %(worker_id)s
      AND a.lease IS NOT DISTINCT FROM %(lease)s::uuid AND a.outcome = 'running'
)
SELECT state, parent_id,
       EXISTS (SELECT 1 FROM django_jobs_dependency d WHERE d.depends_on_id = job.id),
       EXISTS (SELECT 1 FROM {JOB} c
               WHERE c.parent_id = job.id AND c.state IN {sql_in(ACTIVE_STATES)}
                 AND (c.parent_attempt IS NULL OR c.parent_attempt = job.attempt))
FROM job
""")
_FINISH = _END_ATTEMPT.format(condition="", skip_locked="")

# Like the claim, the worker's finish runs inside a PL/pgSQL function whose body is _FINISH
# (migration 0007), so that its plan is kept. The reaper, which is not on the hot path, runs
# _REAP below as a statement.
FINISH_FUNCTION = "django_jobs_finish"
_FINISH_PARAMETERS = (
    "job_id",
    "attempt",
    "worker_id",
    "lease",
    "outcome",
    "result",
    "error",
    "traceback",
    "retryable",
    "retry_delay",
)
FINISH_FUNCTION_BODY = _function_body(
    """
#variable_conflict use_column
BEGIN
    RETURN QUERY {finish};
END
""".format(finish=_FINISH % {name: f"p_{name}" for name in _FINISH_PARAMETERS})
)
_CALL_FINISH = (
    f"SELECT * FROM {FINISH_FUNCTION}(%(job_id)s::bigint, %(attempt)s::integer,"
    " %(worker_id)s::text, %(lease)s::uuid, %(outcome)s::text, %(result)s::text, %(error)s::text,"
    " %(traceback)s::text, %(retryable)s::boolean, %(retry_delay)s::float8)"
)


@dataclasses.dataclass(frozen=True)
class Ended:
    """Where an ended attempt left its job."""

    job_id: int
    state: str
    parent_id: int | None
    has_dependents: bool
    #: Unfinished children that the ended attempt spawned.
    has_children: bool = False

    @property
    def needs_settling(self) -> bool:
        """Whether workflows.settle() has work: a parent to finalize, dependents to promote or
        cancel, this job's own children to wait for, or those of a failed attempt to cancel."""
        if self.state == State.WAITING:
            return True
        if self.has_children:
            return True
        return self.state in TERMINAL_STATES and (self.parent_id is not None or self.has_dependents)


def _ended(job_id: int, row: Sequence[Any] | None) -> Ended | None:
    if row is None:
        return None
    state, parent_id, has_dependents, has_children = row
    return Ended(job_id, State(state).value, parent_id, bool(has_dependents), bool(has_children))


_ENDING_OUTCOMES = frozenset(Outcome.values) - {Outcome.RUNNING, Outcome.RELEASED}


def _end_params(
    lease: Lease,
    outcome: str,
    *,
    result_json: str | None,
    error: str,
    traceback: str,
    retryable: bool,
    retry_delay: float,
) -> dict[str, Any]:
    if outcome not in _ENDING_OUTCOMES:
        raise ValueError(f"an attempt cannot end as {outcome!r}")
    return {
        **_lease_params(lease),
        "outcome": outcome,
        "result": result_json if outcome == Outcome.DONE else None,
        "error": error,
        "traceback": traceback,
        "retryable": retryable,
        "retry_delay": max(0.0, float(retry_delay)),
    }


def finish(
    cursor: Any,
    lease: Lease,
    outcome: str,
    *,
    result_json: str | None = None,
    error: str = "",
    traceback: str = "",
    retryable: bool = True,
    retry_delay: float = 0.0,
) -> Ended | None:
    """End the attempt of ``lease`` with ``outcome``; say where the job went.

    Returns ``None`` if the lease was lost (the job was reaped, cancelled or re-claimed), or if
    this very write had already committed (see :func:`attempt_outcome`).
    """
    result = db.execute(
        cursor,
        _CALL_FINISH,
        _end_params(
            lease,
            outcome,
            result_json=result_json,
            error=error,
            traceback=traceback,
            retryable=retryable,
            retry_delay=retry_delay,
        ),
    )
    return _ended(lease.job_id, result.fetchone())


def finish_and_claim(
    cursor: Any,
    lease: Lease,
    outcome: str,
    queues: Sequence[str] | None,
    skip_tasks: Sequence[str] = (),
    **finish_options: Any,
) -> tuple[Ended | None, ClaimedJob | None]:
    """:func:`finish`, then :func:`claim` the next job for the same worker, as one transaction
    in one round trip: a busy worker pays one commit per job instead of two."""
    finished, claimed = db.execute_together(
        cursor,
        [
            (_CALL_FINISH, _end_params(lease, outcome, **_finish_defaults(finish_options))),
            (_CALL_CLAIM, _claim_params(lease.worker_id, queues, skip_tasks)),
        ],
    )
    return (
        _ended(lease.job_id, finished[0] if finished else None),
        _claimed(lease.worker_id, claimed[0] if claimed else None),
    )


def _finish_defaults(options: dict[str, Any]) -> dict[str, Any]:
    return {
        "result_json": None,
        "error": "",
        "traceback": "",
        "retryable": True,
        "retry_delay": 0.0,
        **options,
    }


# Release: hand an unfinished job back, at shutdown or when its worker finds it never got the
# claim's reply (an orphan, see heartbeat()). The attempt is given back too, since the job did
# not fail; the Attempt row stays, marked released. Index: the primary key;
# attempt_job_number_idx.
_RELEASE = RELEASE.statement(f"""
WITH job AS (
    UPDATE {JOB}
    SET state = 'pending', attempt = attempt - 1, worker_id = NULL, run_after = now(),
        task_missing_since = NULL
    WHERE id = %(job_id)s AND {RELEASE.guard()} AND attempt = %(attempt)s
      AND worker_id = %(worker_id)s AND lease IS NOT DISTINCT FROM %(lease)s::uuid
    RETURNING id, pg_notify('{db.CHANNEL}', queue) IS NULL
), closed AS (
    UPDATE {ATTEMPT} SET finished_at = now(), outcome = 'released', error = %(reason)s
    WHERE job_id = %(job_id)s AND number = %(attempt)s AND worker_id = %(worker_id)s
      AND lease IS NOT DISTINCT FROM %(lease)s::uuid AND outcome = 'running'
      AND EXISTS (SELECT 1 FROM job)
)
SELECT id FROM job
""")


def release(cursor: Any, lease: Lease, reason: str = "released at worker shutdown") -> bool:
    """Put a running job back to pending without using up an attempt. False if lease lost."""
    params = {**_lease_params(lease), "reason": reason}
    return db.execute(cursor, _RELEASE, params).fetchone() is not None


# Hand back a job whose task this worker has not registered (a rolling deploy: pods that run
# the new release enqueue it before every worker runs that release). Like a release, it does
# not count the attempt; and since nothing ran, the attempt row goes too, so that a job offered
# to many old workers piles up no rows. The job stays where it was in the queue: the worker
# passes over the task's jobs for a while (claim's skip_tasks), and a worker that has the task
# takes it at once.
# ``task_missing_since`` says since when workers have been found without the task: the job's
# own mark, else the earliest mark of the task's waiting jobs, else the earliest the worker has
# seen itself (``seen_since``), else now(). A job that runs loses its mark (finish, reap and
# release clear it). The job is not handed back but reported
# ``expired`` when that is longer ago than ``give_up_after`` and no live worker has registered
# the task: the worker then ends it in error, as a finish.
# Index: the primary key; job_task_missing_idx for the task's marks; attempt_job_number_idx;
# the worker table is small.
_HAND_BACK = RELEASE.statement(f"""
WITH target AS (
    SELECT j.id,
           COALESCE(j.task_missing_since,
                    (SELECT min(m.task_missing_since) FROM {JOB} m
                     WHERE m.task = j.task AND m.state = 'pending'
                       AND m.task_missing_since IS NOT NULL),
                    %(seen_since)s::timestamptz,
                    now()) AS missing_since
    FROM {JOB} j
    WHERE j.id = %(job_id)s AND {RELEASE.guard("j")} AND j.attempt = %(attempt)s
      AND j.worker_id = %(worker_id)s AND j.lease IS NOT DISTINCT FROM %(lease)s::uuid
), verdict AS (
    SELECT t.id, t.missing_since,
           t.missing_since < now() - make_interval(secs => %(give_up_after)s::float8)
           AND NOT EXISTS (
               SELECT 1 FROM django_jobs_worker w
               WHERE w.tasks ? %(task)s
                 AND w.last_seen_at >= now() - make_interval(secs => %(worker_timeout)s::float8)
           ) AS expired
    FROM target t
), job AS (
    UPDATE {JOB} j
    SET state = 'pending', attempt = j.attempt - 1, worker_id = NULL,
        task_missing_since = v.missing_since, error = %(reason)s
    FROM verdict v
    WHERE j.id = v.id AND NOT v.expired
      AND {RELEASE.guard("j")} AND j.lease IS NOT DISTINCT FROM %(lease)s::uuid
    RETURNING j.id, pg_notify('{db.CHANNEL}', j.queue) IS NULL
), gone AS (
    DELETE FROM {ATTEMPT}
    WHERE job_id = %(job_id)s AND number = %(attempt)s AND worker_id = %(worker_id)s
      AND lease IS NOT DISTINCT FROM %(lease)s::uuid AND outcome = 'running'
      AND EXISTS (SELECT 1 FROM job)
)
SELECT CASE WHEN EXISTS (SELECT 1 FROM job) THEN 'handed back'
            WHEN v.expired THEN 'expired' END,
       v.missing_since
FROM verdict v
""")
HANDED_BACK = "handed back"
EXPIRED = "expired"


@dataclasses.dataclass(frozen=True)
class HandBack:
    """What became of a job handed back: ``HANDED_BACK``, or ``EXPIRED`` (end it in error
    instead); and since when workers have been found without its task."""

    verdict: str | None
    missing_since: datetime.datetime


def hand_back(
    cursor: Any,
    lease: Lease,
    task: str,
    *,
    give_up_after: float,
    worker_timeout: float,
    seen_since: datetime.datetime | None = None,
) -> HandBack | None:
    """Hand back a job whose task this worker has not registered (see above); ``None`` if the
    lease was lost."""
    params = {
        **_lease_params(lease),
        "task": task,
        "give_up_after": give_up_after,
        "worker_timeout": worker_timeout,
        "seen_since": seen_since,
        "reason": f"waiting for a worker that has registered task {task!r}: "
        f"worker {lease.worker_id} has not",
    }
    row = db.execute(cursor, _HAND_BACK, params).fetchone()
    return None if row is None else HandBack(row[0], row[1])


# What became of one claim's attempt: its outcome (``running`` while it runs), or ``None`` if
# no attempt row carries that lease. A worker asks when a write it retried after a broken
# connection matched nothing: if the first try had committed, the outcome is the one it wrote.
# Index: attempt_job_number_idx (its leading column, job_id).
_ATTEMPT_OUTCOME = f"""
SELECT outcome FROM {ATTEMPT} WHERE job_id = %(job_id)s AND lease = %(lease)s::uuid
"""


def attempt_outcome(cursor: Any, lease: Lease) -> str | None:
    """The outcome recorded for ``lease``'s attempt (see above)."""
    row = db.execute(cursor, _ATTEMPT_OUTCOME, _lease_params(lease)).fetchone()
    return None if row is None else str(row[0])


@dataclasses.dataclass(frozen=True)
class WorkerInfo:
    id: str
    name: str
    host: str
    pid: int
    queues: list[str]
    concurrency: int
    #: The Kubernetes pod the worker runs in (``POD_NAME``), or "".
    pod: str = ""
    #: The task names the worker has registered.
    tasks: list[str] = dataclasses.field(default_factory=list)


# Heartbeat: refresh the worker's registry row (re-creating it if a reaper removed it) and, in
# the same round trip, read back the jobs this worker believes it runs: whether it still holds
# each lease, and whether cancellation was requested. Only the small worker table is written, so
# job rows are not churned by heartbeats.
# Each lease is checked by its token, so a lease that a crash rolled back and a later claim of
# the same job (by this very worker, even) are told apart.
# It also lists *orphans*: jobs running under this worker's id that the worker does not know
# of, with their leases. A claim whose reply was lost with the connection leaves one: the worker
# releases it without counting the attempt. So does a finish that committed and was lost again
# (a failover to a standby that had not received it): the worker still has that finish in memory
# and writes it again (see worker/writes.py and reaper.recover_orphans).
# Index: the worker table's primary key; the job table's primary key for the listed ids;
# job_running_worker_idx for the orphans.
_HEARTBEAT = f"""
WITH beat AS (
    INSERT INTO django_jobs_worker (id, name, host, pid, queues, concurrency, pod, tasks,
                                    started_at, last_seen_at)
    VALUES (%(id)s, %(name)s, %(host)s, %(pid)s, %(queues)s::jsonb, %(concurrency)s, %(pod)s,
            %(tasks)s::jsonb, now(), now())
    ON CONFLICT (id) DO UPDATE SET last_seen_at = now()
    RETURNING id
)
SELECT j.id,
       j.state = 'running' AND j.worker_id = %(id)s AND j.lease = l.lease AS held,
       j.cancel_requested,
       false AS orphan,
       l.lease::text,
       j.attempt
FROM unnest(%(job_ids)s::bigint[], %(leases)s::uuid[]) AS l(id, lease)
JOIN {JOB} j ON j.id = l.id
WHERE EXISTS (SELECT 1 FROM beat)
UNION ALL
SELECT o.id, false, o.cancel_requested, true, o.lease::text, o.attempt
FROM {JOB} o
WHERE o.state = 'running' AND o.worker_id = %(id)s AND o.id <> ALL(%(known_ids)s::bigint[])
  AND EXISTS (SELECT 1 FROM beat)
"""


@dataclasses.dataclass(frozen=True)
class LeaseStatus:
    job_id: int
    held: bool
    cancel_requested: bool


@dataclasses.dataclass(frozen=True)
class Beat:
    """What a heartbeat read back: the status of each lease, by token (a missing token: the
    job was deleted), and the leases of the worker's orphans."""

    leases: dict[str, LeaseStatus]
    orphans: list[Lease]


def heartbeat(
    cursor: Any, worker: WorkerInfo, leases: Sequence[Lease], unwritten: Sequence[int] = ()
) -> Beat:
    """Record that ``worker`` is alive; report on its leases, and on its orphans: jobs running
    under its id that are neither leased nor ``unwritten`` (ended by the worker, with the write
    saying so still to be made)."""
    import json

    job_ids = [lease.job_id for lease in leases]
    rows = db.execute(
        cursor,
        _HEARTBEAT,
        {
            **dataclasses.asdict(worker),
            "queues": json.dumps(worker.queues),
            "tasks": json.dumps(worker.tasks),
            "job_ids": job_ids,
            "leases": [lease.token for lease in leases],
            "known_ids": [*job_ids, *unwritten],
        },
    ).fetchall()
    statuses, orphans = {}, []
    for job_id, held, cancel, orphan, token, attempt in rows:
        if orphan:
            orphans.append(Lease(job_id, attempt, worker.id, token))
        else:
            statuses[token] = LeaseStatus(job_id, bool(held), bool(cancel))
    return Beat(statuses, orphans)


def unregister_worker(cursor: Any, worker_id: str) -> None:
    db.execute(cursor, "DELETE FROM django_jobs_worker WHERE id = %s", [worker_id])


# Reap: end the attempt of a running job whose worker is gone, or that overran its timeout. The
# same statement as finish, with two differences: SKIP LOCKED, so a reaper never waits on a row a
# worker is finishing right now; and the reason is re-checked inside the statement, so a job that
# finished, was re-claimed, or whose worker has just sent a heartbeat is left alone.
# Index: the job's primary key; the worker table's primary key for the heartbeat re-check.
_STILL_DEAD_OR_OVERDUE = """
      AND (
        %(silence)s::float8 IS NULL
        OR NOT EXISTS (
            SELECT 1 FROM django_jobs_worker w
            WHERE w.id = j.worker_id
              AND w.last_seen_at >= now() - make_interval(secs => %(silence)s::float8)
        )
        OR (j.timeout IS NOT NULL
            AND j.started_at < now() - make_interval(secs => j.timeout + %(timeout_grace)s))
      )
"""
_REAP = _END_ATTEMPT.format(condition=_STILL_DEAD_OR_OVERDUE, skip_locked="SKIP LOCKED")


def reap(
    cursor: Any,
    lease: Lease,
    outcome: str,
    *,
    error: str,
    retry_delay: float,
    silence: float | None,
    timeout_grace: float,
) -> Ended | None:
    """End a lost or overdue attempt as ``outcome`` (``lost`` or ``timeout``).

    The job must still be running under ``lease``, and either overdue or its worker silent (no
    heartbeat) for ``silence`` seconds; ``silence=None`` skips that check, for a worker known to
    be gone (an earlier boot of the worker that is starting). Returns the job's new state, or
    ``None`` if the job no longer qualifies.
    """
    params = _end_params(
        lease,
        outcome,
        result_json=None,
        error=error,
        traceback="",
        retryable=True,
        retry_delay=retry_delay,
    )
    params.update(silence=silence, timeout_grace=timeout_grace)
    return _ended(lease.job_id, db.execute(cursor, _REAP, params).fetchone())


# Candidates for the reaper: running jobs whose worker has no fresh heartbeat, or that overran
# their timeout plus a grace period. Index: job_running_worker_idx (partial on running), so the
# cost follows the number of running jobs, not the table's size.
_REAP_CANDIDATES = """
SELECT j.id, j.attempt, j.worker_id, j.lease::text, j.task, j.max_attempts, j.timeout,
       j.queue, EXTRACT(EPOCH FROM now() - j.started_at)::float8 AS running_for,
       w.id IS NULL AS unregistered, w.host, w.pid,
       EXTRACT(EPOCH FROM now() - w.last_seen_at)::float8 AS silent_for,
       j.timeout IS NOT NULL
           AND j.started_at < now() - make_interval(secs => j.timeout + %(timeout_grace)s)
           AS overdue
FROM django_jobs_job j
LEFT JOIN django_jobs_worker w ON w.id = j.worker_id
WHERE j.state = 'running'
ORDER BY j.id
"""


@dataclasses.dataclass(frozen=True)
class RunningJob:
    lease: Lease
    task: str
    max_attempts: int
    timeout: int | None
    queue: str
    running_for: float | None
    unregistered: bool
    host: str | None
    pid: int | None
    silent_for: float | None
    overdue: bool


def running_jobs(cursor: Any, timeout_grace: float) -> list[RunningJob]:
    rows = db.execute(cursor, _REAP_CANDIDATES, {"timeout_grace": timeout_grace}).fetchall()
    jobs = []
    for row in rows:
        job_id, attempt, worker_id, token, task, max_attempts, timeout, queue, *rest = row
        running_for, unregistered, host, pid, silent_for, overdue = rest
        jobs.append(
            RunningJob(
                lease=Lease(job_id, attempt, worker_id, token),
                task=task,
                max_attempts=max_attempts,
                timeout=timeout,
                queue=queue,
                running_for=running_for,
                unregistered=unregistered,
                host=host,
                pid=pid,
                silent_for=silent_for,
                overdue=overdue,
            )
        )
    return jobs


# What cancelling does to a job row ``j``: a pending or waiting job ends at once; a running one is
# flagged, and its worker stops it at its next heartbeat. Shared with the cascades (workflows.py).
CANCEL_SET = """
    state = CASE WHEN j.state = 'running' THEN 'running' ELSE 'cancelled' END,
    cancel_requested = true,
    finished_at = CASE WHEN j.state = 'running' THEN NULL ELSE now() END,
    error = CASE WHEN j.state = 'running' THEN j.error ELSE %(reason)s END"""

# Cancel: a pending or waiting job ends at once; a running one is flagged, and its worker stops it
# at its next heartbeat. Also says whether each job has children or dependents, for the cascade
# (workflows.cancel_with_cascade). One statement per small batch of ids, locked SKIP LOCKED: the
# ids that another transaction held come back as busy, for the caller to try again.
# Index: the primary key; the parent_id and dependency indexes for the two EXISTS.
_CANCEL_MANY = CANCEL.statement(f"""
WITH locked AS (
    SELECT j.id FROM {JOB} j
    WHERE j.id = ANY(%(ids)s) AND {CANCEL.guard("j")}
    FOR NO KEY UPDATE SKIP LOCKED
), changed AS (
    UPDATE {JOB} j SET {CANCEL_SET}
    FROM locked
    WHERE j.id = locked.id AND {CANCEL.guard("j")}
    RETURNING j.id, j.state,
              EXISTS (SELECT 1 FROM {JOB} c WHERE c.parent_id = j.id)
              OR EXISTS (SELECT 1 FROM django_jobs_dependency d WHERE d.depends_on_id = j.id)
)
SELECT id, state, linked FROM changed AS c(id, state, linked)
UNION ALL
SELECT j.id, 'busy', false FROM {JOB} j
WHERE j.id = ANY(%(ids)s) AND {CANCEL.guard("j")}
  AND j.id NOT IN (SELECT id FROM locked)
""")


@dataclasses.dataclass(frozen=True)
class Cancelled:
    job_id: int
    state: str  # "cancelled", or "running" when cancellation was requested
    linked: bool  # has children or dependents, which the cancellation cascades to


@dataclasses.dataclass
class Changes:
    """What a statement over a batch of ids did: the ids it changed, and those it skipped
    because another transaction held them (to try again)."""

    changed: list[Any] = dataclasses.field(default_factory=list)
    busy: list[int] = dataclasses.field(default_factory=list)


def cancel_without_cascade(cursor: Any, ids: Sequence[int], reason: str = "cancelled") -> Changes:
    """Cancel these jobs and nothing else (see above; workflows.cancel_with_cascade does the
    rest): ``changed`` has a :class:`Cancelled` per job changed. Finished jobs are skipped."""
    rows = db.execute(cursor, _CANCEL_MANY, {"ids": list(ids), "reason": reason}).fetchall()
    result = Changes()
    for job_id, state, linked in rows:
        if state == "busy":
            result.busy.append(job_id)
        else:
            result.changed.append(Cancelled(job_id, state, linked))
    return result


#: How often a change over a batch of ids comes back for the ids that another transaction held
#: (it skipped them: SKIP LOCKED), and how long it waits before the first such try; each try
#: waits longer. What is still held then is reported as busy.
BUSY_RETRIES = 5
BUSY_PAUSE = 0.05


def until_free(change: Callable[[list[int]], Changes], ids: Sequence[int]) -> Changes:
    """Run ``change`` over ``ids``, then again over the ids it found busy, a few times."""
    result = change(list(ids))
    for attempt in range(1, BUSY_RETRIES + 1):
        if not result.busy:
            break
        time.sleep(BUSY_PAUSE * attempt)
        again = change(result.busy)
        result = Changes(result.changed + again.changed, again.busy)
    return result


# Forget a dead worker: only once none of its jobs is running any more, and only if it is still
# silent, re-checked in this very statement. A worker that sent a heartbeat since the reaper
# judged it keeps its row; one that was silent that long stops claiming until a heartbeat has
# registered it again (worker/supervisor.py). Index: the worker table's primary key;
# job_running_worker_idx.
_DELETE_SILENT_WORKER = f"""
DELETE FROM django_jobs_worker w
WHERE w.id = %(id)s
  AND w.last_seen_at < now() - make_interval(secs => %(silence)s::float8)
  AND NOT EXISTS (SELECT 1 FROM {JOB} j WHERE j.state = 'running' AND j.worker_id = w.id)
RETURNING w.id
"""


def delete_worker_if_idle(cursor: Any, worker_id: str, silence: float) -> bool:
    """Forget a dead worker (see above). True if its row was deleted."""
    params = {"id": worker_id, "silence": silence}
    return db.execute(cursor, _DELETE_SILENT_WORKER, params).fetchone() is not None


# Retry and run-now are operators' actions (the admin, Job.retry(), Job.run_now()); see their
# set-based forms below, which the single-job functions use too.


def retry(cursor: Any, job_id: int, budget: int) -> bool:
    """Requeue a job that ended in error or was cancelled, ready now, with ``budget`` more
    attempts. False if its state does not allow it, a dependency is not done, or another active
    job holds its unique key."""
    result = until_free(lambda ids: retry_many(cursor, {i: budget for i in ids}), [job_id])
    return result.changed == [job_id]


def run_now(cursor: Any, job_id: int) -> bool:
    """Make a pending job ready now. False if it is not pending."""
    return until_free(lambda ids: run_now_many(cursor, ids), [job_id]).changed == [job_id]


# Retry: a job that ended in error or was cancelled goes back to pending, ready now, with a fresh
# budget of attempts; refused while one of its dependencies is not done, or while another active
# job holds its unique key (and of several jobs in the batch with one key, only the first goes).
# Locked SKIP LOCKED, a small batch of ids at a time; the ids another transaction held come
# back as busy. Index: the primary key; job_admin_unique_key_idx for the unique keys.
_RETRY_MANY = RETRY.statement(f"""
WITH locked AS (
    SELECT j.id, j.unique_key FROM {JOB} j
    WHERE j.id = ANY(%(ids)s) AND {RETRY.guard("j")}
    FOR NO KEY UPDATE SKIP LOCKED
), eligible AS (
    SELECT DISTINCT ON (l.unique_key, CASE WHEN l.unique_key IS NULL THEN l.id END) l.id
    FROM locked l
    WHERE NOT EXISTS (
        SELECT 1 FROM django_jobs_dependency d JOIN {JOB} dj ON dj.id = d.depends_on_id
        WHERE d.job_id = l.id AND dj.state <> 'done')
      AND NOT EXISTS (
        SELECT 1 FROM {JOB} o
        WHERE o.unique_key = l.unique_key AND o.id <> l.id
          AND o.state IN {sql_in(ACTIVE_STATES)})
    ORDER BY l.unique_key, CASE WHEN l.unique_key IS NULL THEN l.id END, l.id
), changed AS (
    UPDATE {JOB} j
    SET state = 'pending', max_attempts = j.attempt + b.budget, run_after = now(),
        finished_at = NULL, worker_id = NULL, cancel_requested = false, result = NULL,
        error = ''
    FROM eligible e, unnest(%(ids)s::bigint[], %(budgets)s::int[]) AS b(id, budget)
    WHERE j.id = e.id AND b.id = e.id
    RETURNING j.id, pg_notify('{db.CHANNEL}', j.queue) IS NULL
)
SELECT id, 'requeued' FROM changed
UNION ALL
SELECT j.id, 'busy' FROM {JOB} j
WHERE j.id = ANY(%(ids)s) AND {RETRY.guard("j")}
  AND j.id NOT IN (SELECT id FROM locked)
""")


def retry_many(cursor: Any, budgets: dict[int, int]) -> Changes:
    """:func:`retry` for many jobs (id -> attempt budget); ``changed`` has the ids requeued."""
    params = {"ids": list(budgets), "budgets": list(budgets.values())}
    return changes_of(db.execute(cursor, _RETRY_MANY, params).fetchall())


# Who holds the unique keys of these jobs: another active job with the same key. For the
# message of a retry that was refused. Index: job_admin_unique_key_idx.
_KEY_HOLDERS = f"""
SELECT j.id, j.unique_key, o.id, o.state FROM {JOB} j
JOIN {JOB} o ON o.unique_key = j.unique_key AND o.id <> j.id
WHERE j.id = ANY(%(ids)s) AND o.state IN {sql_in(ACTIVE_STATES)}
"""


def unique_key_holders(cursor: Any, ids: Sequence[int]) -> dict[int, tuple[str, int, str]]:
    """For each of ``ids`` whose unique key an active job holds: (key, holder id, its state)."""
    rows = db.execute(cursor, _KEY_HOLDERS, {"ids": list(ids)}).fetchall()
    return {job_id: (key, holder, state) for job_id, key, holder, state in rows}


# Run now: a pending job scheduled for later becomes ready at once. Locked SKIP LOCKED, a small
# batch at a time, as above. Index: the primary key.
_RUN_NOW_MANY = RUN_NOW.statement(f"""
WITH locked AS (
    SELECT j.id FROM {JOB} j WHERE j.id = ANY(%(ids)s) AND {RUN_NOW.guard("j")}
    FOR NO KEY UPDATE SKIP LOCKED
), changed AS (
    UPDATE {JOB} j SET run_after = now()
    FROM locked WHERE j.id = locked.id AND {RUN_NOW.guard("j")}
    RETURNING j.id, pg_notify('{db.CHANNEL}', j.queue) IS NULL
)
SELECT id, 'ready' FROM changed
UNION ALL
SELECT j.id, 'busy' FROM {JOB} j
WHERE j.id = ANY(%(ids)s) AND {RUN_NOW.guard("j")} AND j.id NOT IN (SELECT id FROM locked)
""")


def run_now_many(cursor: Any, ids: Sequence[int]) -> Changes:
    """:func:`run_now` for many jobs; ``changed`` has the ids made ready."""
    return changes_of(db.execute(cursor, _RUN_NOW_MANY, {"ids": list(ids)}).fetchall())


def changes_of(rows: Sequence[Sequence[Any]]) -> Changes:
    """:class:`Changes` from a batch statement's ``(id, what)`` rows, ``what`` being ``busy``
    for the ids another transaction held."""
    result = Changes()
    for job_id, what in rows:
        (result.busy if what == "busy" else result.changed).append(job_id)
    return result
