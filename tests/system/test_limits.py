"""Queue controls and concurrency limits with real worker processes: limits that hold under
contention, across retries, reaps and crashes; pausing under load; burst workers."""

from __future__ import annotations

import collections
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from django.test import override_settings

from django_jobs import queues
from django_jobs.models import Attempt, Job
from django_jobs.reaper import reap_pass
from testproject.testjobs.jobs import echo, import_customer, sleep
from tests.conftest import connect, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


class RunningSampler:
    """Counts running jobs per concurrency key and per queue every 10 ms, from a connection of
    its own, and keeps the highest count seen of each."""

    def __init__(self) -> None:
        self.by_key: collections.Counter[str] = collections.Counter()
        self.by_queue: collections.Counter[str] = collections.Counter()
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with connect() as conn:
            while not self._stop.is_set():
                rows = conn.execute(
                    "SELECT coalesce(concurrency_key, ''), queue, count(*)"
                    " FROM django_jobs_job WHERE state = 'running' GROUP BY 1, 2"
                ).fetchall()
                queue_counts: collections.Counter[str] = collections.Counter()
                for key, queue, count in rows:
                    if key:
                        self.by_key[key] = max(self.by_key[key], count)
                    queue_counts[queue] += count
                for queue, count in queue_counts.items():
                    self.by_queue[queue] = max(self.by_queue[queue], count)
                self.samples += 1
                time.sleep(0.01)

    def __enter__(self) -> RunningSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        assert self.samples > 0, "the sampler never read the table"


@contextmanager
def workers(start_worker, count: int, *args: str) -> Iterator[list]:
    started = [start_worker(*args) for _ in range(count)]
    try:
        yield started
    finally:
        for worker in started:
            worker.signal(signal.SIGTERM)
        for worker in started:
            assert worker.wait(60) == 0, worker.output


def span() -> str:
    """From the first claim to the last finish, and the jobs per second over it."""
    with connect() as conn:
        seconds, jobs = conn.execute(
            "SELECT extract(epoch FROM max(finished_at) - min(started_at)), count(*)"
            " FROM django_jobs_attempt"
        ).fetchone()
    return f"{jobs} attempts in {seconds:.1f} s ({jobs / seconds:.0f}/s)"


def all_ended(count: int) -> bool:
    return Job.objects.filter(state__in=["done", "error"]).count() == count


def test_key_limits_are_exact_under_contention(start_worker) -> None:
    # 8 workers x 4 slots hammer 2,000 jobs over 20 keys with a limit of 2 per key.
    calls = [((i % 20, 0.005 + (i % 5) * 0.005), {}) for i in range(2000)]
    by_key: dict[int, list] = collections.defaultdict(list)
    for args, kwargs in calls:
        by_key[args[0]].append((args, kwargs))
    for customer, its_calls in by_key.items():
        import_customer.using(concurrency_key=f"customer:{customer}").enqueue_many(its_calls)
    with RunningSampler() as sampler, workers(start_worker, 8, "--concurrency", "4"):
        wait_for(lambda: all_ended(2000), timeout=240, interval=0.2)
    highest = dict(sampler.by_key)
    print(f"\n{span()}; {sampler.samples} samples; highest running count per key: {highest}")
    assert Job.objects.filter(state="done").count() == 2000
    assert set(sampler.by_key) == {f"customer:{c}" for c in range(20)}
    assert max(sampler.by_key.values()) == 2, sampler.by_key  # reached, never exceeded
    # Held jobs waited as pending: each job was claimed once, and nothing was handed back.
    assert Attempt.objects.count() == 2000
    assert set(Attempt.objects.values_list("outcome", flat=True)) == {"done"}


def test_a_queue_limit_is_exact_across_workers(start_worker) -> None:
    sleep.using(queue="imports").enqueue_many([((0.05,), {}) for _ in range(120)])
    queues.set_limit("imports", 3)
    with RunningSampler() as sampler, workers(start_worker, 4, "--concurrency", "4"):
        wait_for(lambda: all_ended(120), timeout=120, interval=0.2)
    print(f"\nimports: {span()}")
    assert sampler.by_queue["imports"] == 3, sampler.by_queue
    assert Attempt.objects.count() == 120


def test_a_crashed_workers_key_slot_is_freed_by_the_reaper_never_before(start_worker) -> None:
    env = {
        "JOBS_HEARTBEAT_INTERVAL": "0.5",
        "JOBS_WORKER_TIMEOUT": "2",
        "JOBS_POLL_INTERVAL": "0.2",
    }
    first = sleep.using(concurrency_key="tenant:1", max_attempts=2).enqueue(30)
    second = sleep.using(concurrency_key="tenant:1").enqueue(0.1)
    with RunningSampler() as sampler:
        doomed = start_worker("--concurrency", "2", env=env)
        wait_for(lambda: Job.objects.get(pk=first.pk).state == "running")
        survivor = start_worker("--concurrency", "2", env=env)
        time.sleep(1.5)
        # The key's one slot is taken: the second job waits, on both workers.
        assert Job.objects.get(pk=second.pk).state == "pending"
        doomed.kill()
        doomed.proc.communicate()
        time.sleep(1.0)
        assert Job.objects.get(pk=second.pk).state == "pending"  # not before the reaper
        with override_settings(JOBS_WORKER_TIMEOUT=2, JOBS_HEARTBEAT_INTERVAL=0.5):
            wait_for(lambda: reap_pass().actions, timeout=15, interval=0.2)
        # The reaped job went back to pending (a retry): whichever of the two is claimed
        # first, they never run together.
        wait_for(lambda: Job.objects.get(pk=second.pk).state == "done", 20)
        survivor.signal(signal.SIGTERM)
        assert survivor.wait(60) == 0, survivor.output
    assert sampler.by_key["tenant:1"] == 1, sampler.by_key


def test_a_retry_waits_for_a_slot_like_any_other_job(start_worker) -> None:
    from testproject.testjobs.jobs import retry_then_succeed

    flaky = retry_then_succeed.using(concurrency_key="shared", concurrency_limit=1).enqueue(2)
    others = [
        echo.using(concurrency_key="shared", concurrency_limit=1).enqueue(i) for i in range(5)
    ]
    with RunningSampler() as sampler, workers(start_worker, 2, "--concurrency", "3"):
        wait_for(lambda: all_ended(6), timeout=60, interval=0.1)
    assert Job.objects.get(pk=flaky.pk).attempt == 2
    assert {j.state for j in Job.objects.filter(pk__in=[o.pk for o in others])} == {"done"}
    assert sampler.by_key["shared"] == 1


def test_pause_and_resume_under_load(start_worker) -> None:
    long = sleep.using(queue="imports").enqueue_many([((1.0,), {}) for _ in range(8)])
    with workers(start_worker, 2, "--concurrency", "2") as started:
        wait_for(lambda: Job.objects.filter(queue="imports", state="running").count() == 4)
        queues.pause("imports", by="test", reason="load test")
        short = echo.enqueue_many([((i,), {}) for i in range(20)])
        # The running jobs finish normally; nothing new is claimed from the paused queue, and
        # the other queue's work flows.
        wait_for(lambda: Job.objects.filter(queue="imports", state="done").count() == 4, 15)
        wait_for(
            lambda: Job.objects.filter(pk__in=[j.pk for j in short], state="done").count() == 20, 15
        )
        time.sleep(1.0)
        imports = Job.objects.filter(queue="imports")
        assert imports.filter(state="pending").count() == 4
        assert imports.filter(state="running").count() == 0
        queues.resume("imports")
        wait_for(lambda: imports.filter(state="done").count() == 8, 15)
        assert len(started) == 2
    assert Attempt.objects.filter(job__in=long).count() == 8


def test_a_burst_worker_treats_a_paused_queue_as_empty(start_worker) -> None:
    held = echo.using(queue="imports").enqueue_many([((i,), {}) for i in range(5)])
    free = echo.enqueue_many([((i,), {}) for i in range(5)])
    queues.pause("imports")
    worker = start_worker("--burst", "--concurrency", "2")
    assert worker.wait(60) == 0, worker.output
    assert {j.state for j in Job.objects.filter(pk__in=[j.pk for j in free])} == {"done"}
    assert {j.state for j in Job.objects.filter(pk__in=[j.pk for j in held])} == {"pending"}
    assert not Attempt.objects.filter(job__in=[j.pk for j in held]).exists()
