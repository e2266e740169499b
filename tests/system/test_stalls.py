"""Nothing a job does stalls its supervisor: a job that floods its output and its log, reports
progress in a tight loop and returns a big result runs next to an ordinary job, and the
worker's heartbeats keep their interval throughout."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from datetime import datetime

import pytest

from django_jobs import conf
from django_jobs.models import Job
from testproject.testjobs.jobs import flood, sleep
from tests.conftest import connect, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

INTERVAL = 1.0
#: How much longer than the interval a gap between two heartbeats may be: the loaded CI machine
#: (2 cores, a flood writing 20 MB next door) delays a beat by far less; a stalled loop, by
#: as long as the stall.
SLACK = 2.0


class LaggingReader:
    """Reads a worker's output as a log collector that falls behind would: at once, except
    that after the first ``after`` bytes it stops reading for ``pause`` seconds. Meanwhile a
    writer that finds the pipe full waits: a job's print, and any write of the supervisor's to
    the same output."""

    def __init__(self, fd: int, after: int = 1024 * 1024, pause: float = 10.0) -> None:
        self.fd = fd
        self.after = after
        self.pause = pause
        self.chunks: list[bytes] = []
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        read = 0
        paused = False
        while chunk := os.read(self.fd, 64 * 1024):
            self.chunks.append(chunk)
            read += len(chunk)
            if read >= self.after and not paused:
                paused = True
                time.sleep(self.pause)

    def text(self) -> str:
        self._thread.join(60)
        return b"".join(self.chunks).decode("utf-8", "replace")


class HeartbeatSampler:
    """Reads the worker's ``last_seen_at`` every 20 ms from a connection of its own, and keeps
    each distinct value: one per heartbeat that committed."""

    def __init__(self, worker: str) -> None:
        self.worker = worker
        self.beats: list[datetime] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with connect() as conn:
            while not self._stop.is_set():
                row = conn.execute(
                    "SELECT last_seen_at FROM django_jobs_worker WHERE id LIKE %s",
                    [self.worker + ":%"],
                ).fetchone()
                if row is not None and (not self.beats or row[0] != self.beats[-1]):
                    self.beats.append(row[0])
                time.sleep(0.02)

    def gaps(self) -> list[float]:
        return [(b - a).total_seconds() for a, b in zip(self.beats, self.beats[1:], strict=False)]

    def __enter__(self) -> HeartbeatSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


# Measures the gaps between heartbeats: alone on the machine.
@pytest.mark.serial
@pytest.mark.slow
def test_a_flooding_job_does_not_delay_its_workers_heartbeats(start_worker) -> None:
    result_bytes = conf.max_payload_bytes() - 1024
    flooding = flood.enqueue(megabytes=20, result_bytes=result_bytes)
    ordinary = sleep.enqueue(4)  # its end is logged while the reader lags
    worker = start_worker(
        "--concurrency",
        "2",
        env={"JOBS_HEARTBEAT_INTERVAL": str(INTERVAL), "JOBS_POLL_INTERVAL": "0.2"},
    )
    assert worker.proc.stdout is not None
    reader = LaggingReader(worker.proc.stdout.fileno())
    jobs = Job.objects.filter(pk__in=[flooding.pk, ordinary.pk]).order_by("pk")
    with HeartbeatSampler(worker.name) as sampler:
        with contextlib.suppress(AssertionError):
            wait_for(lambda: {job.state for job in jobs.all()} == {"done"}, 120, 0.2)
        states = [(job.state, job.error) for job in jobs.all()]
        worker.signal(signal.SIGTERM)
        code = worker.proc.wait(60)
    output = reader.text()
    assert code == 0, output[-3000:]
    assert states == [("done", ""), ("done", "")], (states, sampler.gaps(), output[-3000:])

    flooding.refresh_from_db()
    assert len(flooding.result["blob"]) == result_bytes
    gaps = sampler.gaps()
    assert len(gaps) >= 5, sampler.beats
    print(f"heartbeats: {len(gaps) + 1}, longest gap {max(gaps):.2f}s (interval {INTERVAL}s)")
    assert max(gaps) < INTERVAL + SLACK, gaps
