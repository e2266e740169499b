"""Each statement that writes ``Job.state``, run on jobs in every state: the moves it makes are
exactly the ones its transition declares in django_jobs/states.py, no more (its guard leaves the
other states alone) and no fewer (no declared move goes unused).

A move is (state before, state after) of a job row the statement wrote, found by the row's new
tuple (its ``ctid``); a new row moves from ``None``. tests/unit/test_states.py finds the
statements; this file runs every one of them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from django_jobs import store, workflows
from django_jobs.models import Dependency, Job
from django_jobs.states import Outcome, State
from django_jobs.store import Lease
from django_jobs.store.sql import query
from testproject.testjobs.jobs import echo
from tests.factories import JobFactory
from tests.unit.helpers import declared_statements_by_name

pytestmark = pytest.mark.django_db

WORKER = "state-machine:1:aaaaaa"

Moves = set[tuple[str | None, str]]


@contextlib.contextmanager
def watching() -> Iterator[Moves]:
    """Collect the moves of the job rows written inside the block."""
    moves: Moves = set()
    before = _rows()
    yield moves
    for job_id, (state, ctid) in _rows().items():
        if job_id not in before:
            moves.add((None, state))
        elif before[job_id][1] != ctid:  # an UPDATE writes a new tuple, even if nothing changed
            moves.add((before[job_id][0], state))


def _rows() -> dict[int, tuple[str, str]]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT id, state, ctid::text FROM django_jobs_job")
        return {job_id: (state, ctid) for job_id, state, ctid in cursor.fetchall()}


def jobs_in_every_state(**fields: Any) -> list[Job]:
    """One job in each state (waiting twice: for its dependencies, and for its children), all
    under one worker and without a lease token, so that a fenced statement given their ids and
    attempts is held back by nothing but its guard on the state."""
    now = timezone.now()
    ran = {"attempt": 1, "started_at": now}
    over = {**ran, "finished_at": now}
    specs = [
        {"state": State.WAITING},
        {"state": State.WAITING, **ran},
        {"state": State.PENDING},
        {"state": State.RUNNING, **ran},
        {"state": State.DONE, **over},
        {"state": State.ERROR, **over},
        {"state": State.CANCELLED, **over},
    ]
    return [JobFactory(worker_id=WORKER, **spec, **fields) for spec in specs]


def running(**fields: Any) -> Job:
    return JobFactory(
        state=State.RUNNING, attempt=1, started_at=timezone.now(), worker_id=WORKER, **fields
    )


def finished(state: str, **fields: Any) -> Job:
    now = timezone.now()
    return JobFactory(state=state, attempt=1, started_at=now, finished_at=now, **fields)


def lease(job: Job) -> Lease:
    return Lease(job.pk, job.attempt, WORKER, None)


def depending_on(upstream: Job, jobs: list[Job]) -> list[Job]:
    Dependency.objects.bulk_create(Dependency(job=job, depends_on=upstream) for job in jobs)
    return jobs


def page(job_id: int, **params: Any) -> dict[str, Any]:
    """The parameters of a paged cascade statement over one job's dependents or children."""
    return {"job_id": job_id, "after": 0, "batch": 100, "reason": "cancelled: test", **params}


# ---------------------------------------------------------------------- one exercise per statement


def claim() -> Moves:
    # The worker's function, through each of its branches: any queue, one queue, some queues.
    for queue in ("one", "two", "three"):
        jobs_in_every_state(queue=queue)
    with watching() as moves, connection.cursor() as cursor:
        for queues in (["one"], ["two", "elsewhere"], None):
            while store.claim(cursor, WORKER, queues) is not None:
                pass
    return moves


def claim_statement(queues: list[str] | None) -> Callable[[], Moves]:
    """Run the claim function's branch for ``queues`` as a statement (store.claim_sql)."""

    def exercise() -> Moves:
        jobs_in_every_state()
        sql, params = store.claim_sql(queues)
        with watching() as moves, connection.cursor() as cursor:
            while True:
                cursor.execute(sql, {"worker_id": WORKER, **params})
                if cursor.fetchone() is None:
                    break
        return moves

    return exercise


def claim_keyed_job() -> Moves:
    """Run the claim function's claim of a keyed candidate on every job, each given a
    concurrency key first."""
    everyone = jobs_in_every_state()
    Job.objects.update(concurrency_key="k", concurrency_limit=1)
    with watching() as moves, connection.cursor() as cursor:
        for job in everyone:
            cursor.execute(
                store.claim_branch("claim_keyed_job"), {"worker_id": WORKER, "job_id": job.pk}
            )
    return moves


def end_attempts(end: Callable[[Any, Lease, str, bool], object]) -> Moves:
    """End attempts with ``end(cursor, lease, outcome, retryable)`` every way they can end."""
    everyone = jobs_in_every_state()
    succeeds, spawned, cancelled, retried, failed = (running() for _ in range(5))
    JobFactory(parent=spawned, parent_attempt=1)  # an unfinished child: the parent waits
    Job.objects.filter(pk=cancelled.pk).update(cancel_requested=True)
    Job.objects.filter(pk=failed.pk).update(max_attempts=1)
    with watching() as moves, connection.cursor() as cursor:
        for job in everyone:
            end(cursor, lease(job), Outcome.DONE, True)
        end(cursor, lease(succeeds), Outcome.DONE, True)
        end(cursor, lease(spawned), Outcome.DONE, True)
        end(cursor, lease(cancelled), Outcome.ERROR, True)
        end(cursor, lease(retried), Outcome.ERROR, True)
        end(cursor, lease(failed), Outcome.ERROR, True)
    return moves


def finish() -> Moves:
    return end_attempts(
        lambda cursor, lease, outcome, retryable: store.finish(
            cursor, lease, outcome, retryable=retryable
        )
    )


def reap() -> Moves:
    # The reaper ends attempts with the finish's statement (see ending.sql), lost or overdue.
    return end_attempts(
        lambda cursor, lease, outcome, _: store.reap(
            cursor,
            lease,
            outcome,
            error="lost",
            retry_delay=0,
            silence=None,
            timeout_grace=0,
        )
    )


def release() -> Moves:
    everyone = jobs_in_every_state()
    with watching() as moves, connection.cursor() as cursor:
        for job in everyone:
            store.release(cursor, lease(job))
    return moves


def hand_back() -> Moves:
    everyone = jobs_in_every_state()
    with watching() as moves, connection.cursor() as cursor:
        for job in everyone:
            store.hand_back(cursor, lease(job), job.task, give_up_after=3600, worker_timeout=60)
    return moves


def cancel() -> Moves:
    ids = [job.pk for job in jobs_in_every_state()]
    with watching() as moves, connection.cursor() as cursor:
        store.cancel_without_cascade(cursor, ids)
    return moves


def expire_due() -> Moves:
    everyone = jobs_in_every_state()
    Job.objects.filter(pk__in=[job.pk for job in everyone]).update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )
    with watching() as moves, connection.cursor() as cursor:
        store.expire_due(cursor)
    return moves


def cancel_children() -> Moves:
    parent = running()
    jobs_in_every_state(parent=parent, parent_attempt=1)
    with watching() as moves, connection.cursor() as cursor:
        params = page(parent.pk, attempt=None, final=True)
        cursor.execute(query("cancel_children"), params)
    return moves


def cancel_dependents() -> Moves:
    upstream = finished(State.ERROR)
    depending_on(upstream, jobs_in_every_state())
    with watching() as moves, connection.cursor() as cursor:
        cursor.execute(query("cancel_dependents"), page(upstream.pk))
    return moves


def promote() -> Moves:
    upstream = finished(State.DONE)
    depending_on(upstream, jobs_in_every_state())
    with watching() as moves, connection.cursor() as cursor:
        cursor.execute(query("promote"), page(upstream.pk))
    return moves


def settle_new() -> Moves:
    ready = depending_on(finished(State.DONE), jobs_in_every_state())
    doomed = depending_on(finished(State.ERROR), jobs_in_every_state())
    with watching() as moves, connection.cursor() as cursor:
        cursor.execute(query("settle_new"), {"ids": [job.pk for job in ready + doomed]})
    return moves


def finalize_parent() -> Moves:
    childless = jobs_in_every_state()
    waiting = {"state": State.WAITING, "attempt": 1, "started_at": timezone.now()}
    failed_child, cancelled_child = JobFactory(**waiting), JobFactory(**waiting)
    for parent, last in ((failed_child, State.ERROR), (cancelled_child, State.CANCELLED)):
        finished(State.DONE, parent=parent, parent_attempt=1)
        finished(last, parent=parent, parent_attempt=1)
    with watching() as moves, connection.cursor() as cursor:
        for job in [*childless, failed_child, cancelled_child]:
            workflows.finalize_parent(cursor, job.pk)
    return moves


def retry() -> Moves:
    ids = [job.pk for job in jobs_in_every_state()]
    with watching() as moves, connection.cursor() as cursor:
        store.retry_many(cursor, dict.fromkeys(ids, 3))
    return moves


def run_now() -> Moves:
    ids = [job.pk for job in jobs_in_every_state()]
    with watching() as moves, connection.cursor() as cursor:
        store.run_now_many(cursor, ids)
    return moves


def _upstreams() -> tuple[Job, Job]:
    """A dependency still waiting, and one that ended in error."""
    return JobFactory(state=State.WAITING), finished(State.ERROR)


def enqueue_one() -> Moves:
    """``insert_plain_job``: no unique key, no parent."""
    unfinished, failed = _upstreams()
    with watching() as moves:
        echo.enqueue()
        echo.using(depends_on=[unfinished]).enqueue()
        echo.using(depends_on=[failed]).enqueue()
    return moves


def enqueue_one_keyed() -> Moves:
    """``insert_job``: with a unique key, or a parent."""
    unfinished, failed = _upstreams()
    parent = running()
    with watching() as moves:
        echo.using(unique_key="state-machine").enqueue()
        echo.using(unique_key="state-machine-waits", depends_on=[unfinished]).enqueue()
        echo.using(parent=parent, depends_on=[failed]).enqueue()
    return moves


def enqueue_many() -> Moves:
    unfinished, failed = _upstreams()
    calls = [((1,), {}), ((2,), {})]
    with watching() as moves:
        echo.enqueue_many(calls)
        echo.using(depends_on=[unfinished]).enqueue_many(calls)
        echo.using(depends_on=[failed]).enqueue_many(calls)
    return moves


#: Every statement that writes ``state`` (or is guarded by the state machine), and how to run it
#: from every state.
EXERCISES: dict[str, Callable[[], Moves]] = {
    "insert_plain_job": enqueue_one,
    "insert_job": enqueue_one_keyed,
    "copy_jobs": enqueue_many,
    "django_jobs_claim": claim,
    "django_jobs_finish": finish,
    "reap": reap,
    "release": release,
    "hand_back": hand_back,
    "cancel_many": cancel,
    "expire_due": expire_due,
    "retry_many": retry,
    "run_now_many": run_now,
    "promote": promote,
    "cancel_dependents": cancel_dependents,
    "cancel_children": cancel_children,
    "finalize_parent": finalize_parent,
    "settle_new": settle_new,
}


#: The claim function's branches, each run alone as a statement from every state: each must
#: make exactly the claim's moves.
CLAIM_BRANCHES: dict[str, Callable[[], Moves]] = {
    "claim_any_queue": claim_statement(None),
    "claim_one_queue": claim_statement(["default"]),
    "claim_some_queues": claim_statement(["default", "other"]),
    "claim_keyed_job": claim_keyed_job,
}


@pytest.mark.django_db(False)
def test_every_declared_statement_has_an_exercise() -> None:
    assert set(EXERCISES) == set(declared_statements_by_name())


@pytest.mark.parametrize("name", list(EXERCISES))
def test_a_statement_makes_exactly_the_moves_its_transition_declares(name: str) -> None:
    _, transition = declared_statements_by_name()[name]
    moves = EXERCISES[name]()
    assert moves - transition.moves == set(), f"undeclared moves of {transition.name!r}"
    assert transition.moves - moves == set(), f"declared moves of {transition.name!r} not made"


@pytest.mark.parametrize("name", list(CLAIM_BRANCHES))
def test_a_branch_of_the_claim_makes_exactly_the_claims_moves(name: str) -> None:
    _, transition = declared_statements_by_name()[store.CLAIM_FUNCTION]
    moves = CLAIM_BRANCHES[name]()
    assert moves - transition.moves == set(), f"undeclared moves of {transition.name!r}"
    assert transition.moves - moves == set(), f"declared moves of {transition.name!r} not made"
