"""Next to real application code: long transactions, locks held by others, outages. Each test
reproduces one way that ordinary application behaviour used to stall or lose work."""

from __future__ import annotations

import signal
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection, transaction
from django.utils import timezone

from django_jobs import store
from django_jobs.models import Job, Worker
from django_jobs.runtime.backoff import OUTAGE_RETRY_CAP
from testproject.testjobs.jobs import echo, sleep
from tests.conftest import connect, wait_for
from tests.factories import JobFactory, WorkerFactory
from tests.system.helpers import FAST_WORKER, executions
from tests.timing import BUSY_MACHINE_MARGIN, LOCK_WAIT_MS

pytestmark = pytest.mark.django_db(transaction=True)

#: As FAST_WORKER, but gone only after 5 s without a heartbeat.
FAST = {**FAST_WORKER, "JOBS_WORKER_TIMEOUT": "5"}


def state(job: Job) -> str:
    return Job.objects.get(pk=job.pk).state


def test_a_dependent_enqueued_in_a_long_transaction_is_promoted_when_its_dependency_ended_meanwhile(
    start_worker,
) -> None:
    # The dependency ends while the transaction that enqueues its dependent is still open: its
    # finish can neither wait for that transaction nor see the new dependency row. The
    # dependent must become pending once the transaction commits, without the reaper.
    upstream = sleep.using(max_attempts=1).enqueue(0.5)
    worker = start_worker("--queue", "default", env=FAST)
    wait_for(lambda: state(upstream) == "running")
    with transaction.atomic():
        dependent = echo.using(queue="elsewhere", depends_on=[upstream]).enqueue("after")
        assert dependent.state == "waiting"
        with connect() as other:
            wait_for(
                lambda: (
                    other.execute(
                        "SELECT state FROM django_jobs_job WHERE id = %s", [upstream.pk]
                    ).fetchone()[0]
                    == "done"
                ),
                timeout=15,
            )
        time.sleep(1)  # the transaction stays open after the dependency has ended
    committed = time.monotonic()
    wait_for(lambda: state(dependent) == "pending", timeout=10, interval=0.01)
    delay = time.monotonic() - committed
    finished = Job.objects.get(pk=upstream.pk).finished_at
    print(f"\ndependent pending {delay * 1000:.0f} ms after its enqueue committed")
    assert Job.objects.get(pk=upstream.pk).state == "done" and finished is not None
    # Settled as the transaction commits; left to the reaper (not running here), it would stay
    # waiting past the 10 s above.
    assert delay < BUSY_MACHINE_MARGIN
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0


def test_a_dependent_becomes_pending_within_a_second_of_its_last_dependency_ending(
    start_worker,
) -> None:
    upstream = sleep.using(max_attempts=1).enqueue(0.3)
    dependent = echo.using(queue="elsewhere", depends_on=[upstream]).enqueue("after")
    worker = start_worker("--queue", "default", env=FAST)
    wait_for(lambda: state(dependent) == "pending", timeout=20, interval=0.01)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT EXTRACT(EPOCH FROM now() - finished_at) FROM django_jobs_job WHERE id = %s",
            [upstream.pk],
        )
        since_finish = float(cursor.fetchone()[0])
    print(f"\ndependent pending {since_finish * 1000:.0f} ms after its dependency finished")
    # Milliseconds by the database's clock (promoted right after the finish), and what a busy
    # machine adds to seeing it; left to the reaper (not running here), never.
    assert since_finish < BUSY_MACHINE_MARGIN
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0


def test_an_open_transaction_holding_one_job_does_not_hold_back_the_workers_other_results(
    start_worker,
) -> None:
    # Application code holds a lock on a job row in a long transaction. That job's finish
    # waits, and is retried after each bounded wait; the worker's other jobs meanwhile are
    # claimed, run and recorded as usual, and a pending job held only FOR KEY SHARE (as a
    # foreign key check of an enqueue takes it) is still claimed.
    blocked = sleep.using(priority=10).enqueue(1.0)
    others = [echo.enqueue(f"other {i}") for i in range(4)]
    with connect() as holder:
        worker = start_worker("--concurrency", "1", env={**FAST, "JOBS_LOCK_TIMEOUT_MS": "300"})
        wait_for(lambda: state(blocked) == "running")
        holder.execute("BEGIN")
        holder.execute("SELECT 1 FROM django_jobs_job WHERE id = %s FOR SHARE", [blocked.pk])
        kept = JobFactory(task="tests.echo")
        holder.execute("SELECT 1 FROM django_jobs_job WHERE id = %s FOR KEY SHARE", [kept.pk])
        try:
            wait_for(lambda: all(state(job) == "done" for job in [*others, kept]), timeout=15)
        except AssertionError:
            worker.kill()
            worker.wait()
            raise AssertionError(worker.output) from None
        assert state(blocked) == "running"  # its finish still waits for the lock
        holder.execute("COMMIT")
    wait_for(lambda: state(blocked) == "done", timeout=15)
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0
    assert "trying it again later" in worker.output


def test_the_reaper_never_forgets_a_worker_that_sent_a_heartbeat_since_it_was_judged() -> None:
    alive = WorkerFactory(last_seen_at=timezone.now())
    silent = WorkerFactory(last_seen_at=timezone.now() - timedelta(minutes=5))
    with connection.cursor() as cursor:
        assert not store.delete_worker_if_idle(cursor, alive.id, silence=60)
        assert store.delete_worker_if_idle(cursor, silent.id, silence=60)
    assert list(Worker.objects.values_list("id", flat=True)) == [alive.id]


@pytest.mark.slow
def test_a_lost_lease_is_noticed_soon_after_an_outage_not_an_interval_later(
    worker_env, tmp_path: Path
) -> None:
    from tests.conftest import WorkerProcess
    from tests.crashable import running_cluster

    with running_cluster() as cluster:
        # Heartbeats 20 s apart: a worker that noticed the loss only at its next heartbeat would
        # notice 20 s late, far past the retries' time and a busy machine's margin.
        settings = {
            "JOBS_HEARTBEAT_INTERVAL": "20",
            "JOBS_WORKER_TIMEOUT": "60",
            "JOBS_KILL_GRACE": "1",
            "JOBS_POLL_INTERVAL": "0.2",
        }
        env = cluster.migrated_database("jobs", {**worker_env, **settings})
        path = tmp_path / "journal.jsonl"
        cluster.query(
            "INSERT INTO django_jobs_job (task, kwargs) VALUES ('tests.journal', %s)",
            [f'{{"path": "{path}", "seconds": 60}}'],
            dbname="jobs",
        )
        worker = WorkerProcess([], env, "outage")
        try:
            wait_for(lambda: executions(path), timeout=30)
            seen = cluster.query("SELECT last_seen_at FROM django_jobs_worker", dbname="jobs")
            wait_for(
                lambda: (
                    cluster.query("SELECT last_seen_at FROM django_jobs_worker", dbname="jobs")
                    != seen
                ),
                timeout=20,
                interval=0.05,
            )
            # An outage over the next heartbeat's time (18 s into the 20 s interval, for 2 s), then
            # the job taken from the worker: the scenario's own timing.
            time.sleep(18)
            cluster.stop()
            time.sleep(2)
            cluster.start()
            cluster.query(
                "UPDATE django_jobs_job SET state = 'cancelled', finished_at = now()",
                dbname="jobs",
            )
            back = time.time()
            wait_for(lambda: executions(path)[0].last < time.time() - 0.5, timeout=40)
            noticed = executions(path)[0].last - back
        finally:
            worker.kill()
            worker.proc.communicate()
        print(f"\nlease loss noticed {noticed:.1f}s after the database came back")
        # The failed heartbeat is tried again within OUTAGE_RETRY_CAP of the database's return.
        assert noticed < OUTAGE_RETRY_CAP + BUSY_MACHINE_MARGIN


@pytest.mark.slow
def test_a_large_cascade_never_stops_the_workers_heartbeats_or_its_other_jobs(
    start_worker,
) -> None:
    # 90,000 dependents to promote when one job ends: hundreds of statements. The worker settles
    # them a slice at a time, and keeps sending heartbeats and running jobs in between.
    upstream = sleep.using(max_attempts=1).enqueue(0.2)
    echo.using(queue="elsewhere", depends_on=[upstream]).enqueue_many(
        ((), {"n": i}) for i in range(DEPENDENTS)
    )
    meanwhile = None
    worker = start_worker("--concurrency", "2", "--queue", "default", env=FAST)
    beats: list[tuple[float, object]] = []
    started = None
    with connect() as watcher:

        def all_promoted() -> bool:
            # By job_waiting_idx: cheap however many are left, so the watching does not slow
            # the cascade down.
            return not watcher.execute(
                "SELECT EXISTS (SELECT 1 FROM django_jobs_job WHERE state = 'waiting'"
                " AND queue = 'elsewhere')"
            ).fetchone()[0]

        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            row = watcher.execute("SELECT max(last_seen_at) FROM django_jobs_worker").fetchone()
            if row[0] is not None and (not beats or beats[-1][1] != row[0]):
                beats.append((time.monotonic(), row[0]))
            state_now = watcher.execute(
                "SELECT state FROM django_jobs_job WHERE id = %s", [upstream.pk]
            ).fetchone()[0]
            if started is None and state_now == "done":
                started = time.monotonic()
                meanwhile = echo.enqueue("meanwhile")
            if started is not None and all_promoted():
                break
            time.sleep(0.05)
        finished = time.monotonic()
        meanwhile_state = (
            meanwhile
            and watcher.execute(
                "SELECT state FROM django_jobs_job WHERE id = %s", [meanwhile.pk]
            ).fetchone()[0]
        )
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0
    assert started is not None and pending_total(DEPENDENTS)
    during = [t for t, _ in beats if started <= t <= finished]
    gaps = [b - a for a, b in zip([started, *during], [*during, finished], strict=True)]
    print(
        f"\ncascade: {DEPENDENTS:,} dependents promoted in {finished - started:.1f}s; "
        f"{len(during)} heartbeats meanwhile, longest gap {max(gaps):.2f}s"
    )
    assert finished - started > 2  # it did span several heartbeat intervals
    # A heartbeat every 0.5 s all through (a third of them is enough on a busy machine); a
    # cascade settled in one go would hold them all back until it ended.
    assert len(during) >= (finished - started) / (3 * 0.5), (len(during), finished - started)
    assert max(gaps) < 0.5 + BUSY_MACHINE_MARGIN
    assert meanwhile_state == "done"


DEPENDENTS = 90_000

#: The pauses before a job another transaction holds is tried again, in all (0.75 s).
BUSY_PAUSES = sum(store.BUSY_PAUSE * attempt for attempt in range(1, store.BUSY_RETRIES + 1))


def pending_total(expected: int) -> bool:
    return Job.objects.filter(queue="elsewhere", state="pending").count() == expected


def test_operators_actions_skip_a_locked_job_instead_of_waiting_and_say_so(settings) -> None:
    from django_jobs import operator_actions

    settings.JOBS_LOCK_TIMEOUT_MS = LOCK_WAIT_MS  # a wait for the held job would take 30 s
    jobs = [JobFactory() for _ in range(250)]
    held = jobs[123]
    with connect() as holder:
        holder.execute("BEGIN")
        holder.execute("SELECT 1 FROM django_jobs_job WHERE id = %s FOR UPDATE", [held.pk])
        started = time.monotonic()
        report = operator_actions.cancel(Job.objects.all())
        elapsed = time.monotonic() - started
        holder.execute("ROLLBACK")
    assert report.changed == 249
    assert report.skipped == {"locked by another transaction": 1}
    assert state(held) == "pending"
    # The statements, and the pauses before the held job is tried again (0.75 s in all); not
    # one lock timeout per statement.
    assert elapsed < BUSY_PAUSES + BUSY_MACHINE_MARGIN
    assert "1 skipped: 1 locked by another transaction" in report.message("cancelled")


def test_admin_actions_under_atomic_requests_commit_batch_by_batch_with_bounded_waits(
    admin_client, monkeypatch, settings
) -> None:
    monkeypatch.setitem(connection.settings_dict, "ATOMIC_REQUESTS", True)
    settings.JOBS_LOCK_TIMEOUT_MS = LOCK_WAIT_MS  # a wait for the held job would take 30 s
    jobs = [JobFactory() for _ in range(30)]
    held = jobs[0]
    with connect() as holder:
        holder.execute("BEGIN")
        holder.execute("SELECT 1 FROM django_jobs_job WHERE id = %s FOR UPDATE", [held.pk])
        started = time.monotonic()
        response = admin_client.post(
            "/admin/django_jobs/job/",
            {"action": "cancel_selected", "_selected_action": [j.pk for j in jobs]},
            follow=True,
        )
        elapsed = time.monotonic() - started
        holder.execute("ROLLBACK")
    assert response.status_code == 200
    assert "29 jobs cancelled" in response.content.decode()
    assert elapsed < BUSY_PAUSES + BUSY_MACHINE_MARGIN  # as above
    assert state(held) == "pending"
    assert Job.objects.filter(state="cancelled").count() == 29


def test_the_admin_deletes_a_large_selection_in_small_batches_and_skips_locked_jobs(
    admin_client,
) -> None:
    finished = [JobFactory(finished=True) for _ in range(230)]
    running = JobFactory(claimed=True)
    held = finished[7]
    with connect() as holder:
        holder.execute("BEGIN")
        holder.execute("SELECT 1 FROM django_jobs_job WHERE id = %s FOR UPDATE", [held.pk])
        page = admin_client.post(
            "/admin/django_jobs/job/",
            {"action": "delete_selected", "select_across": "1", "_selected_action": [running.pk]},
        )
        assert page.status_code == 200 and "230 jobs (finished" in page.content.decode()
        response = admin_client.post(
            "/admin/django_jobs/job/",
            {
                "action": "delete_selected",
                "select_across": "1",
                "_selected_action": [running.pk],
                "post": "yes",
            },
            follow=True,
        )
        holder.execute("ROLLBACK")
    assert response.status_code == 200
    assert set(Job.objects.values_list("pk", flat=True)) == {held.pk, running.pk}


def test_a_retried_parent_is_decided_by_the_children_of_its_final_attempt(start_worker) -> None:
    from testproject.testjobs.jobs import spawn_then_crash

    parent = spawn_then_crash.enqueue()
    worker = start_worker("--concurrency", "2", env=FAST)
    wait_for(lambda: state(parent) in ("done", "error", "cancelled"), timeout=30)
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0
    parent.refresh_from_db()
    assert (parent.state, parent.attempt) == ("done", 2), parent.error
    children = {c.parent_attempt: c for c in Job.objects.filter(parent=parent)}
    assert children[2].state == "done"
    assert children[1].state in ("cancelled", "error")


def test_a_cancelled_parent_spawns_nothing_more_and_its_late_children_never_run(
    start_worker,
) -> None:
    from testproject.testjobs.jobs import spawner

    parent = spawner.enqueue(count=40, pause=0.1)
    worker = start_worker("--concurrency", "3", env={**FAST, "JOBS_HEARTBEAT_INTERVAL": "2"})
    wait_for(lambda: Job.objects.filter(parent=parent).count() >= 2, timeout=30)
    Job.objects.get(pk=parent.pk).cancel()
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        (cancelled_at,) = cursor.fetchone()
    # It ends cancelled if the worker stopped it, or done if it returned first, having been
    # refused a child: either way, nothing it spawns after the cancel runs.
    wait_for(lambda: state(parent) in ("cancelled", "done"), timeout=30)
    wait_for(
        lambda: not Job.objects.filter(parent=parent, state__in=["pending", "running"]).exists(),
        timeout=30,
    )
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0
    late = Job.objects.filter(parent=parent, created_at__gt=cancelled_at)
    assert not late.filter(state="done").exists()
    assert not Job.objects.filter(parent=parent, state__in=["pending", "waiting"]).exists()
    # The job was told: it stopped spawning, or was stopped, within a heartbeat interval.
    assert Job.objects.filter(parent=parent).count() < 40


def test_retrying_two_failed_jobs_with_one_unique_key_requeues_one_and_names_the_holder(
    admin_client,
) -> None:
    first = JobFactory(finished=True, state="error", unique_key="report:7")
    second = JobFactory(finished=True, state="error", unique_key="report:7")
    other = JobFactory(finished=True, state="error")
    response = admin_client.post(
        "/admin/django_jobs/job/",
        {"action": "retry_selected", "_selected_action": [first.pk, second.pk, other.pk]},
        follow=True,
    )
    text = response.content.decode()
    assert response.status_code == 200
    assert "2 jobs requeued, 1 skipped" in text
    assert f"job #{second.pk}: unique key &#x27;report:7&#x27; is held by job #{first.pk}" in text
    assert {state(j) for j in (first, other)} == {"pending"}
    assert state(second) == "error"
