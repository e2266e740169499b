"""Time-based controls with real worker processes: rate limits that hold cluster-wide under
contention, across a worker's SIGKILL and a PostgreSQL crash; deadlines in a paused queue; a
fair queue under one tenant's backlog. Each figure the tests print comes from the attempts'
start times, read from the database."""

from __future__ import annotations

import collections
import json
import signal
import statistics
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime

import pytest

from django_jobs import queues
from django_jobs.models import Attempt, Job, Worker
from django_jobs.registry import MAX_INT
from testproject.testjobs.jobs import echo, expiring, rated, sleep, tenant_import
from tests.conftest import WorkerProcess, wait_for
from tests.crashable import CrashableCluster

pytestmark = pytest.mark.django_db(transaction=True)

FAST = {"JOBS_POLL_INTERVAL": "0.1", "JOBS_HEARTBEAT_INTERVAL": "0.5"}


@contextmanager
def workers(start_worker, count: int, *args: str, env=None) -> Iterator[list[WorkerProcess]]:
    started = [start_worker(*args, env={**FAST, **(env or {})}) for _ in range(count)]
    try:
        yield started
    finally:
        for worker in started:
            worker.signal(signal.SIGTERM)
        for worker in started:
            assert worker.wait(60) == 0, worker.output


def busiest_window(starts: list[datetime], seconds: float) -> int:
    """The most starts in any closed window of ``seconds``."""
    times = sorted(start.timestamp() for start in starts)
    most, low = 0, 0
    for high, moment in enumerate(times):
        while moment - times[low] > seconds:
            low += 1
        most = max(most, high - low + 1)
    return most


def rate_of(starts: list[datetime]) -> float:
    """Starts per second, from the first start to the last."""
    times = sorted(start.timestamp() for start in starts)
    return (len(times) - 1) / (times[-1] - times[0])


def refills(starts: list[datetime], limit: int) -> list[float]:
    """For each start after the first ``limit``: the seconds since the start ``limit`` places
    before it, which had to leave the window first. With jobs waiting, that is the period plus
    the claim's latency (the worker's next poll, and what a busy machine adds) when the limiter
    lets a start in as soon as its window has room; a limiter of half the rate needs at least
    two periods for every one of them, however fast the machine."""
    times = sorted(start.timestamp() for start in starts)
    return [later - earlier for earlier, later in zip(times, times[limit:], strict=False)]


def starts_by_key() -> dict[str, list[datetime]]:
    found: dict[str, list[datetime]] = collections.defaultdict(list)
    for key, started in Attempt.objects.values_list("job__rate_key", "started_at"):
        found[key or ""].append(started)
    return found


def ended(count: int) -> Callable[[], bool]:
    return lambda: Job.objects.filter(state__in=["done", "error", "cancelled"]).count() == count


# Measures the rate each key reaches: alone on the machine.
@pytest.mark.serial
def test_rate_limits_are_exact_under_contention_and_hold_back_nothing_else(start_worker) -> None:
    # 6 workers x 4 slots; 120 jobs over 3 keys at "10/2s", and 60 unlimited jobs in the queue.
    keys = ["partner:a", "partner:b", "partner:c"]
    for key in keys:
        rated.using(rate_key=key).enqueue_many([((key, 0.2), {}) for _ in range(40)])
    free = sleep.enqueue_many([((0.2,), {}) for _ in range(60)])
    with workers(start_worker, 6, "--concurrency", "4"):
        wait_for(ended(180), timeout=120, interval=0.2)
    by_key = starts_by_key()
    windows = {key: busiest_window(by_key[key], 2.0) for key in keys}
    rates = {key: round(rate_of(by_key[key]), 2) for key in keys}
    first = min(min(starts) for starts in by_key.values())
    free_starts = list(Attempt.objects.filter(job__in=free).values_list("started_at", flat=True))
    free_last = (max(free_starts) - first).total_seconds()
    median_refill = {key: round(statistics.median(refills(by_key[key], 10)), 2) for key in keys}
    print(
        f"\nmost starts in any 2 s window per key: {windows}; achieved rate per key (starts/s):"
        f" {rates}; median refill per key (s): {median_refill}; the 60 unlimited jobs all"
        f" started within {free_last:.1f} s of the first start"
    )
    assert Job.objects.filter(state="done").count() == 180
    assert max(windows.values()) == 10, windows  # reached, never exceeded
    # Close to 10 per 2 s: most windows refilled within a period of their room coming (2 s,
    # and 2 s of latency for a busy machine), which no limiter of half the rate can do.
    assert all(refill < 2.0 + 2.0 for refill in median_refill.values()), median_refill
    # Not held back behind the keyed jobs: the 60 unlimited ones all started before the last
    # window of any key, which its limit opens 6 s after its first start at the earliest.
    assert max(free_starts) < min(sorted(by_key[key])[30] for key in keys), free_last
    # Held jobs waited as pending: one attempt each, nothing handed back or retried.
    assert Attempt.objects.count() == 180


# Measures the rate the queue reaches: alone on the machine.
@pytest.mark.serial
def test_a_queue_rate_limit_holds_across_two_workers(start_worker) -> None:
    sleep.using(queue="reports").enqueue_many([((0.05,), {}) for _ in range(30)])
    env = {"JOBS_QUEUE_RATE_LIMITS": json.dumps({"reports": "5/s"})}
    with workers(start_worker, 2, "--concurrency", "4", env=env):
        wait_for(ended(30), timeout=60, interval=0.2)
    starts = list(Attempt.objects.values_list("started_at", flat=True))
    most = busiest_window(starts, 1.0)
    print(
        f"\nqueue 'reports' at 5/s with 2 workers: most starts in any 1 s window: {most};"
        f" achieved {rate_of(starts):.2f} starts/s;"
        f" median refill {statistics.median(refills(starts, 5)):.2f} s"
    )
    assert most == 5
    # Most windows refilled within a period (1 s) of their room coming: a limiter of half the
    # rate (each worker held to its share, say) needs two periods for every one.
    assert statistics.median(refills(starts, 5)) < 1.0 + 1.0


def test_a_rate_limit_survives_a_worker_sigkill_with_no_burst(start_worker) -> None:
    rated.using(rate_key="kill", rate_limit="4/3s").enqueue_many(
        [(("kill", 0.1), {}) for _ in range(16)]
    )
    doomed = start_worker("--concurrency", "4", env=FAST)
    wait_for(lambda: Attempt.objects.count() >= 4, timeout=30, interval=0.05)
    doomed.kill()
    doomed.proc.communicate()
    with workers(start_worker, 1, "--concurrency", "4"):
        wait_for(
            lambda: (
                Job.objects.filter(state__in=["done", "error"]).count() == 16
                or (
                    not Job.objects.filter(state__in=["pending", "waiting"]).exists()
                    and Attempt.objects.count() >= 16
                )
            ),
            timeout=90,
            interval=0.2,
        )
    starts = list(Attempt.objects.values_list("started_at", flat=True))
    most = busiest_window(starts, 3.0)
    print(f"\n'4/3s' across a SIGKILL: {len(starts)} starts, most in any 3 s window: {most}")
    assert most <= 4


def test_deadlines_in_a_paused_queue_expire_and_cancel_their_dependents(start_worker) -> None:
    queues.pause("reports", by="test")
    with workers(start_worker, 1, "--concurrency", "2", env={"JOBS_EXPIRY_INTERVAL": "0.2"}):
        wait_for(Worker.objects.exists, timeout=30, interval=0.1)  # up and looking
        # Deadlines 2 s apart: a look every 0.2 s ends each within 2 s of its deadline (1.8 s
        # for a busy machine); looks 5 s apart (the default) leave at least one 2 s late.
        doomed = [
            expiring.using(queue="reports", expires_after=1 + 2 * i).enqueue(i) for i in range(5)
        ]
        dependents = [echo.using(depends_on=[job]).enqueue("after") for job in doomed]
        wait_for(
            lambda: (
                Job.objects.filter(pk__in=[j.pk for j in dependents], state="cancelled").count()
                == 5
            ),
            timeout=30,
            interval=0.1,
        )
    for job in Job.objects.filter(pk__in=[j.pk for j in doomed]):
        assert job.state == "cancelled" and job.error.startswith("expired: not started")
        lateness = (job.finished_at - job.expires_at).total_seconds()
        assert 0 <= lateness < 2.0
    assert not Attempt.objects.exists()  # none ever ran


# Orders the claims by their start times, which a loaded machine can skew: alone on the
# machine.
@pytest.mark.serial
def test_a_fair_queue_starts_another_tenants_jobs_within_a_few_claims(start_worker) -> None:
    limit = {"concurrency_limit": 1000}
    tenant_import.using(concurrency_key="tenant:a", **limit).enqueue_many(
        [(("a", n, 0.02), {}) for n in range(300)]
    )
    tenant_import.using(concurrency_key="tenant:b", **limit).enqueue_many(
        [(("b", n, 0.02), {}) for n in range(5)]
    )
    env = {"JOBS_FAIR_QUEUES": json.dumps(["imports"])}
    with workers(start_worker, 1, "--concurrency", "2", "--queues", "imports", env=env):
        wait_for(
            lambda: Job.objects.filter(concurrency_key="tenant:b", state="done").count() == 5,
            timeout=60,
            interval=0.1,
        )
    order = list(
        Attempt.objects.order_by("started_at", "id").values_list("job__concurrency_key", flat=True)
    )
    positions = [i + 1 for i, key in enumerate(order) if key == "tenant:b"]
    print(f"\nfair queue: tenant B's 5 jobs were claims {positions} after A's 300 were queued")
    assert positions[-1] <= 12, positions


# ----------------------------------------------------------------------- a PostgreSQL crash

DB = "jobs"


@pytest.fixture
def cluster_settings() -> dict[str, str]:
    return {"synchronous_commit": "on"}


@pytest.mark.slow
@pytest.mark.crash
def test_a_rate_limit_survives_a_postgres_crash_with_no_burst(
    cluster: CrashableCluster, worker_env: dict[str, str], start_worker
) -> None:
    env = cluster.migrated_database(DB, {**worker_env, **FAST, "JOBS_WORKER_TIMEOUT": "60"})
    cluster.query(
        "INSERT INTO django_jobs_job (task, kwargs, max_attempts, concurrency_key,"
        " concurrency_limit, rate_key, rate_limit, rate_period)"
        " SELECT 'tests.rated', '{\"seconds\": 0.05}', 3, 'rate:crash', %s, 'crash', 5, 3"
        " FROM generate_series(1, 30)",
        [MAX_INT],
        dbname=DB,
    )
    worker = start_worker("--concurrency", "4", env=env)

    def started() -> int:
        try:
            return int(cluster.query("SELECT count(*) FROM django_jobs_attempt", dbname=DB)[0][0])
        except Exception:  # restarting
            return -1

    wait_for(lambda: started() >= 7, timeout=30, interval=0.05)
    cluster.crash()
    cluster.start()
    wait_for(lambda: started() >= 30, timeout=120, interval=0.2)
    worker.signal(signal.SIGTERM)
    worker.wait(60)
    rows = cluster.query("SELECT started_at FROM django_jobs_attempt", dbname=DB)
    starts = [row[0] for row in rows]
    most = busiest_window(starts, 3.0)
    print(
        f"\n'5/3s' across a PostgreSQL crash: {len(starts)} starts, most in any 3 s window: {most}"
    )
    assert most <= 5
