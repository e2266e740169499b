"""The hot statements, driven directly: claim order, SKIP LOCKED, fencing, plans."""

from __future__ import annotations

import dataclasses
import importlib
import json
import re
import threading
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_jobs import migrations, store
from django_jobs.models import Attempt, Job
from django_jobs.states import Outcome
from django_jobs.store import sql
from django_jobs.store.sql import functions
from tests.conftest import connect
from tests.factories import JobFactory
from tests.integration.helpers import (
    CLAIM_INDEXES,
    CLAIM_QUEUE_INDEXES,
    WORKER,
    claim,
    generic_plan,
    uses_one_of,
)

pytestmark = pytest.mark.django_db


def test_claim_marks_running_counts_the_attempt_and_opens_an_attempt_row() -> None:
    job = JobFactory(args=[1, "two"], kwargs={"k": True})
    claimed = claim()
    assert claimed.id == job.pk and claimed.attempt == 1
    assert (json.loads(claimed.args_json), json.loads(claimed.kwargs_json)) == (
        [1, "two"],
        {"k": True},
    )
    job.refresh_from_db()
    assert job.state == Job.State.RUNNING and job.attempt == 1 and job.worker_id == WORKER
    assert job.started_at is not None
    attempt = Attempt.objects.get(pk=claimed.attempt_id)
    assert (attempt.job_id, attempt.number, attempt.worker_id, attempt.outcome) == (
        job.pk,
        1,
        WORKER,
        Outcome.RUNNING,
    )


def test_claim_order_is_priority_then_run_after_then_fifo() -> None:
    now = timezone.now()
    low = JobFactory(priority=-5, run_after=now - timedelta(hours=1))
    old = JobFactory(priority=0, run_after=now - timedelta(minutes=10))
    first_fifo = JobFactory(priority=0, run_after=now - timedelta(minutes=1))
    second_fifo = JobFactory(priority=0, run_after=first_fifo.run_after)
    high = JobFactory(priority=10, run_after=now)
    order = [claim().id for _ in range(5)]
    assert order == [high.pk, old.pk, first_fifo.pk, second_fifo.pk, low.pk]
    assert claim() is None


def test_claim_skips_future_jobs_other_queues_and_non_pending_states() -> None:
    JobFactory(run_after=timezone.now() + timedelta(minutes=5))
    JobFactory(queue="other")
    JobFactory(state=Job.State.WAITING)
    JobFactory(finished=True)
    assert claim(["default"]) is None
    assert claim(["default", "reports"]) is None
    assert claim(["other"]) is not None


def test_claim_with_several_queues() -> None:
    a = JobFactory(queue="a")
    b = JobFactory(queue="b", priority=5)
    JobFactory(queue="c")
    assert [claim(["a", "b"]).id, claim(["a", "b"]).id, claim(["a", "b"])] == [b.pk, a.pk, None]


@pytest.mark.django_db(transaction=True)
def test_a_locked_job_is_skipped_not_waited_for() -> None:
    locked, free = JobFactory(), JobFactory()
    with connect() as other:
        with other.transaction():
            other.execute("SELECT 1 FROM django_jobs_job WHERE id = %s FOR UPDATE", [locked.pk])
            assert claim().id == free.pk
            assert claim() is None
        assert claim().id == locked.pk


@pytest.mark.django_db(transaction=True)
def test_concurrent_claims_never_hand_out_a_job_twice() -> None:
    JobFactory.create_batch(200)
    claimed: list[int] = []
    lock = threading.Lock()

    def drain(n: int) -> None:
        with connect() as conn, conn.cursor() as cursor:
            while (job := store.claim(cursor, f"w{n}:1:000000", None)) is not None:
                with lock:
                    claimed.append(job.id)

    threads = [threading.Thread(target=drain, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(claimed) == 200 and len(set(claimed)) == 200


def finish(lease, outcome=Outcome.DONE, **kwargs):
    """The job's state after a finish, or None if the lease was lost."""
    with connection.cursor() as cursor:
        ended = store.finish(cursor, lease, outcome, **kwargs)
    return None if ended is None else ended.state


def test_finish_stores_the_result_and_closes_the_attempt() -> None:
    JobFactory()
    lease = claim().lease
    assert finish(lease, result_json='{"rows": 3}') == "done"
    job = Job.objects.get(pk=lease.job_id)
    assert job.state == "done" and job.result == {"rows": 3} and job.finished_at is not None
    attempt = Attempt.objects.get(job_id=lease.job_id, number=lease.attempt)
    assert attempt.outcome == "done" and attempt.finished_at is not None


def test_finish_is_fenced_on_attempt_and_worker() -> None:
    JobFactory()
    lease = claim().lease
    stale_attempt = dataclasses.replace(lease, attempt=lease.attempt - 1)
    other_worker = dataclasses.replace(lease, worker_id="someone-else:2:bbbbbb")
    assert finish(stale_attempt) is None
    assert finish(other_worker) is None
    job = Job.objects.get(pk=lease.job_id)
    assert job.state == "running"
    assert Attempt.objects.get(job_id=lease.job_id, number=lease.attempt).outcome == "running"
    assert finish(lease) == "done"
    assert finish(lease) is None  # a second finish of the same lease changes nothing


def _roll_back_the_claim(lease) -> None:
    """Undo a claim the way a server crash that lost its commit would."""
    Attempt.objects.filter(job_id=lease.job_id, number=lease.attempt).delete()
    Job.objects.filter(pk=lease.job_id).update(
        state="pending", attempt=lease.attempt - 1, worker_id=None, started_at=None, lease=None
    )


def test_every_claim_draws_a_lease_token_that_a_rolled_back_claim_cannot_repeat() -> None:
    JobFactory(max_attempts=3)
    lost = claim().lease
    _roll_back_the_claim(lost)
    again = claim().lease
    # Same job, same attempt number, same worker: only the token tells the two claims apart.
    assert (again.job_id, again.attempt, again.worker_id) == (lost.job_id, lost.attempt, WORKER)
    assert again.token != lost.token
    assert Job.objects.get(pk=again.job_id).lease.hex == again.token.replace("-", "")
    assert Attempt.objects.get(job_id=again.job_id).lease.hex == again.token.replace("-", "")
    assert finish(lost) is None
    with connection.cursor() as cursor:
        assert not store.release(cursor, lost)
        beat = store.heartbeat(cursor, _worker_info(), [lost, again])
    assert beat.leases[lost.token].held is False
    assert beat.leases[again.token].held is True
    assert finish(again) == "done"


def test_a_release_is_fenced_on_the_token_and_gives_the_attempt_back() -> None:
    JobFactory(max_attempts=1)
    lease = claim().lease
    with connection.cursor() as cursor:
        assert not store.release(cursor, dataclasses.replace(lease, token=str(uuid.uuid4())))
        assert store.release(cursor, lease, "released: its worker never got the claim")
        assert store.attempt_outcome(cursor, lease) == "released"
    job = Job.objects.get(pk=lease.job_id)
    assert (job.state, job.attempt, job.worker_id) == ("pending", 0, None)
    assert Attempt.objects.get(job_id=job.pk).error == "released: its worker never got the claim"


def test_a_heartbeat_lists_jobs_running_under_the_worker_that_it_does_not_hold() -> None:
    held, orphan = JobFactory(), JobFactory()
    first = claim().lease
    second = claim().lease
    assert {first.job_id, second.job_id} == {held.pk, orphan.pk}
    with connection.cursor() as cursor:
        beat = store.heartbeat(cursor, _worker_info(), [first])
    assert beat.orphans == [second]
    assert beat.leases[first.token].held


def _worker_info() -> store.WorkerInfo:
    return store.WorkerInfo(
        id=WORKER, name="test-worker", host="h", pid=1, queues=[], concurrency=1
    )


def test_failure_with_attempts_left_goes_back_to_pending_after_the_delay() -> None:
    JobFactory(max_attempts=2)
    lease = claim().lease
    state = finish(lease, Outcome.ERROR, error="ValueError: x", traceback="tb", retry_delay=30)
    assert state == "pending"
    job = Job.objects.get(pk=lease.job_id)
    assert job.worker_id is None and job.finished_at is None and job.error == "ValueError: x"
    with connection.cursor() as cursor:
        cursor.execute("SELECT run_after - now() FROM django_jobs_job WHERE id = %s", [job.pk])
        (remaining,) = cursor.fetchone()
    assert timedelta(seconds=29) < remaining <= timedelta(seconds=30)
    assert claim() is None  # not before its time
    attempt = Attempt.objects.get(job_id=lease.job_id, number=lease.attempt)
    assert (attempt.outcome, attempt.error, attempt.traceback) == ("error", "ValueError: x", "tb")


def test_failure_on_the_last_attempt_or_not_retryable_ends_in_error() -> None:
    JobFactory(max_attempts=1)
    assert finish(claim().lease, Outcome.ERROR, error="boom") == "error"
    JobFactory(max_attempts=5)
    assert finish(claim().lease, Outcome.ERROR, error="Fail", retryable=False) == "error"


def test_release_gives_the_attempt_back() -> None:
    JobFactory(max_attempts=1)
    lease = claim().lease
    with connection.cursor() as cursor:
        assert store.release(cursor, lease) is True
        assert store.release(cursor, lease) is False
    job = Job.objects.get(pk=lease.job_id)
    assert (job.state, job.attempt, job.worker_id) == ("pending", 0, None)
    assert Attempt.objects.get(job_id=lease.job_id, number=lease.attempt).outcome == "released"
    assert claim().attempt == 1


def test_the_database_refuses_an_unknown_state() -> None:
    from django.db import IntegrityError, transaction

    job = JobFactory()
    with pytest.raises(IntegrityError), transaction.atomic():
        Job.objects.filter(pk=job.pk).update(state="exploded")
    with pytest.raises(IntegrityError), transaction.atomic():
        Job.objects.filter(pk=job.pk).update(priority=500)
    with pytest.raises(IntegrityError), transaction.atomic():
        Job.objects.filter(pk=job.pk).update(state="running")  # running needs a worker


def _plan(sql: str, params: dict) -> str:
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = on")
        cursor.execute("EXPLAIN " + sql, params)
        return "\n".join(row[0] for row in cursor.fetchall())


@pytest.mark.django_db(transaction=True)
def test_claim_plan_uses_the_partial_index_and_never_sorts_at_100k_pending() -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO django_jobs_job (task, queue, priority, state, run_after)
            SELECT 'tests.noop', (ARRAY['default','reports','imports'])[1 + g % 3], (g % 7) - 3,
                   'pending', now() - make_interval(secs => g % 1000)
            FROM generate_series(1, 100000) g
            """
        )
        cursor.execute(
            """
            INSERT INTO django_jobs_job (task, queue, state, attempt, started_at, finished_at,
                                         worker_id)
            SELECT 'tests.noop', 'default', 'done', 1, now(), now(), 'w'
            FROM generate_series(1, 50000)
            """
        )
        cursor.execute("ANALYZE django_jobs_job")
    plans = {}
    for queues, indexes in [(None, CLAIM_INDEXES), (["reports"], CLAIM_QUEUE_INDEXES)]:
        sql, params = store.claim_sql(queues)
        plans[queues and queues[0]] = plan = _plan(sql, {"worker_id": WORKER, **params})
        assert uses_one_of(indexes, plan), plan
        # (The guard reads the queue table, a row per paused or limited queue, whole.)
        assert "Sort" not in plan and "Seq Scan on django_jobs_job" not in plan, plan
        # The worker runs the statement inside django_jobs_claim(), which keeps a generic plan
        # (one made without the parameters' values): that one must use the index as well.
        generic = generic_plan(sql, {"worker_id": WORKER, **params})
        assert uses_one_of(indexes, generic), generic
        assert "Sort" not in generic and "Seq Scan on django_jobs_job" not in generic, generic
    print("\n\n".join(plans.values()))


def _function_body(name: str) -> str:
    """The body of the function ``name`` as its newest file makes it: its text between the
    ``$body$``."""
    return sql.query(name).split("$body$")[1]


def _words(text: str) -> str:
    return " ".join(text.replace("CREATE OR REPLACE FUNCTION", "CREATE FUNCTION").split())


FUNCTIONS = (
    store.CLAIM_FUNCTION,
    store.FINISH_FUNCTION,
    "django_jobs_keyed_candidate",
    "django_jobs_free_candidate",
    "django_jobs_rate_room",
    "django_jobs_rate_take",
)


def test_the_worker_functions_in_the_database_are_the_newest_function_files() -> None:
    # A new version of a function needs a migration that makes it, or the worker would run the
    # old one.
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT proname, prosrc FROM pg_proc WHERE proname = ANY(%s)", [list(FUNCTIONS)]
        )
        bodies = {name: source.strip() for name, source in cursor.fetchall()}
    assert bodies == {name: _function_body(name).strip() for name in FUNCTIONS}


def _definitions(cursor) -> dict[str, str]:
    cursor.execute(
        "SELECT p.oid::regprocedure::text, pg_get_functiondef(p.oid) FROM pg_proc p"
        " WHERE p.proname LIKE 'django_jobs%%' AND pg_function_is_visible(p.oid)"
    )
    return dict(cursor.fetchall())


def test_making_the_newest_function_files_again_changes_nothing_in_the_database() -> None:
    # Each function is exactly what its newest file makes: its arguments, result, attributes
    # and body. (Made again inside the test's transaction, which is rolled back.)
    with connection.cursor() as cursor:
        migrated = _definitions(cursor)
        for newest in functions.newest():
            cursor.execute(
                newest.statement.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)
            )
        assert _definitions(cursor) == migrated
    assert {name.split("(")[0] for name in migrated} == {found.name for found in functions.newest()}


@pytest.mark.django_db(False)
def test_migrations_make_functions_from_their_files_only() -> None:
    # Every statement of a migration that makes a function is a version's file, loaded by name.
    statements = {found.statement for found in functions.FUNCTIONS.values()}
    made = set()
    for path in sorted(Path(migrations.__file__).parent.glob("0*.py")):
        module = importlib.import_module(f"django_jobs.migrations.{path.stem}")
        for operation in module.Migration.operations:
            for attribute in ("sql", "reverse_sql"):
                found = getattr(operation, attribute, None) or []
                for statement in [found] if isinstance(found, str) else found:
                    if "FUNCTION" in statement and "DROP FUNCTION" not in statement:
                        assert statement in statements, (path.stem, statement[:80])
                        made.add(statement)
    assert made == statements


def _as_statement(branch: str, arguments: dict[str, str]) -> str:
    """A branch of a function's body, with psycopg's parameters for the function's arguments."""
    for argument, parameter in arguments.items():
        branch = branch.replace(argument, parameter)
    return _words(branch.strip().removesuffix(";"))


@pytest.mark.django_db(False)
def test_the_claim_statements_are_the_branches_of_the_claim_function() -> None:
    branches = re.findall(r"RETURN QUERY(.*?);", _function_body(store.CLAIM_FUNCTION), re.S)
    arguments = {"p_worker_id": "%(worker_id)s", "p_skip_tasks": "%(skip_tasks)s"}
    one_queue = _words(store.claim_branch("claim_one_queue"))
    assert [_as_statement(branch, arguments) for branch in branches] == [
        _words(store.claim_branch("claim_any_queue")),
        one_queue.replace("%(queue)s", "v_queues[1]"),
        _words(store.claim_branch("claim_some_queues")).replace("%(queues)s", "v_queues"),
        _words(store.claim_branch("claim_keyed_job")).replace("%(job_id)s", "v_keyed.id"),
        _words(store.claim_branch("claim_free_job")).replace("%(queue)s", "v_free.queue"),
    ]


#: The guard of the claim's first statement: no control on the worker's queues, no keyed job.
_GUARD = re.compile(
    r"\s*AND NOT EXISTS \(SELECT FROM django_jobs_queue q.*?IS NOT NULL\)(?=\n)", re.S
)


@pytest.mark.django_db(False)
def test_the_reap_is_the_finish_function_after_a_re_check_and_skip_locked() -> None:
    reap = _words(sql.query("reap"))
    recheck = re.search(r"AND \( %\(silence\)s.*?timeout_grace\)s\)\) \) ", reap)
    assert recheck is not None
    assert "FOR NO KEY UPDATE SKIP LOCKED" in reap
    # The next state is decided by the finish alone: the reap writes no row itself.
    assert f"CROSS JOIN LATERAL {store.FINISH_FUNCTION}( t.id," in reap
    assert "UPDATE" not in reap.replace("FOR NO KEY UPDATE", "") and " CASE " not in reap


@pytest.mark.django_db(transaction=True)  # autocommit, as on a worker's connection
def test_finish_and_claim_end_one_job_and_take_the_next_in_one_round_trip() -> None:
    first, second = JobFactory(), JobFactory()
    lease = claim().lease
    assert lease.job_id == first.pk
    with CaptureQueriesContext(connection) as queries, connection.cursor() as cursor:
        ended, claimed = store.finish_and_claim(
            cursor, lease, Outcome.DONE, None, result_json='"ok"'
        )
    assert len(queries) == 1
    assert ended.state == "done" and Job.objects.get(pk=first.pk).result == "ok"
    assert claimed.id == second.pk and claimed.attempt == 1
    assert Job.objects.get(pk=second.pk).worker_id == WORKER
    # A lost lease is still reported as such, and the claim still happens.
    third = JobFactory()
    with connection.cursor() as cursor:
        ended, claimed = store.finish_and_claim(cursor, lease, Outcome.DONE, None)
    assert ended is None and claimed.id == third.pk


@pytest.mark.parametrize(
    ("control", "queues"),
    [
        ("INSERT INTO django_jobs_queue (name, paused) VALUES ('reports', true)", None),
        ("INSERT INTO django_jobs_queue (name, concurrency_limit) VALUES ('reports', 5)", None),
        (
            "INSERT INTO django_jobs_queue (name, paused) VALUES ('reports', true)",
            ["reports", "default"],
        ),
        (
            "INSERT INTO django_jobs_job (task, concurrency_key, concurrency_limit)"
            " VALUES ('tests.keyed', 'k', 1)",
            ["default"],
        ),
    ],
)
def test_the_claims_first_statement_reads_and_locks_no_job_while_controls_are_in_use(
    control, queues
) -> None:
    # The claim function's first statement claims only while none of the worker's queues is
    # paused or limited and no keyed job waits: its guard is a one-time filter, checked before
    # the ordered scan starts, so that it neither claims nor locks a job the longer way must
    # decide on (a job of a paused queue, say); the function then takes the longer way.
    JobFactory(queue="default")
    sql, params = store.claim_sql(queues)
    names = ["worker_id", *params]
    values = {"worker_id": WORKER, **params}
    for number, name in enumerate(names, start=1):
        sql = sql.replace(f"%({name})s", f"${number}")
    with connection.cursor() as cursor:
        cursor.execute(control)
        cursor.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        cursor.execute(f"PREPARE guarded_claim AS {sql}")
        try:
            placeholders = ", ".join(["%s"] * len(names))
            cursor.execute(
                f"EXPLAIN (ANALYZE, COSTS OFF) EXECUTE guarded_claim({placeholders})",
                [values[name] for name in names],
            )
            plan = "\n".join(row[0] for row in cursor.fetchall())
        finally:
            cursor.execute("DEALLOCATE guarded_claim")
    # The planner reads the claim index as a plain or a bitmap index scan, by the table's
    # statistics at the time: either way, never executed.
    scans = re.findall(
        r"(?:Bitmap )?Index Scan (?:using|on) job_claim_free\w*(?: on django_jobs_job)? .*", plan
    )
    assert scans and all("(never executed)" in scan for scan in scans), plan
    assert "LockRows (never executed)" in plan, plan
    assert "Insert on django_jobs_attempt (actual" in plan and "rows=0" in plan, plan
    # ... and the function, by the longer way, still claims the job of the open queue.
    claimed = claim(queues)
    assert claimed is not None and claimed.queue == "default"
