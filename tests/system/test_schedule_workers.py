"""Periodic jobs fired by real worker processes: every worker runs a scheduler, and each tick
still enqueues exactly once; pause, edit and resume take effect on the next tick; a scheduler
that was away does not flood when it comes back.

The first test waits for three real minute boundaries (about three minutes); the counts it
prints (ticks, jobs, duplicates) are the ones quoted in docs/benchmarks.md.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection

from django_jobs.models import Job, Schedule, ScheduleTick
from tests.conftest import ROOT, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

#: Schedulers look at the table every 2 s, so that edits made between ticks are seen.
FAST = {"JOBS_SCHEDULER_INTERVAL": "2", "JOBS_POLL_INTERVAL": "0.2", "JOBS_HEARTBEAT_INTERVAL": "2"}
CODE = {"code-minute": {"task": "tests.echo", "cron": "* * * * *", "args": ["code"]}}


def db_now() -> datetime:
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        return cursor.fetchone()[0]  # type: ignore[no-any-return]


def after_next_boundary(margin: float = 6.0) -> None:
    """Sleep until ``margin`` seconds past the next whole minute of the database's clock."""
    now = db_now()
    time.sleep(60 - now.second - now.microsecond / 1e6 + margin)


def echo_schedule(name: str, label: str, **fields: Any) -> Schedule:
    schedule = Schedule.objects.create(
        name=name, task="tests.echo", cron="* * * * *", args=[label], **fields
    )
    schedule.recompute_next_run()
    return schedule


def counts(name: str, labels: list[str] | None = None) -> dict[str, int]:
    """Ticks recorded, jobs enqueued (those whose first argument is one of the schedule's
    ``labels``, default its current one), and duplicates (jobs beyond one per tick)."""
    schedule = Schedule.objects.get(name=name)
    ticks = list(schedule.ticks.values_list("fire_at", "job_id"))
    jobs = Job.objects.filter(task="tests.echo", args__0__in=labels or schedule.args[:1])
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) - count(DISTINCT date_trunc('minute', created_at)) FROM "
            "django_jobs_job WHERE id = ANY(%s)",
            [list(jobs.values_list("id", flat=True))],
        )
        per_minute = cursor.fetchone()[0]
    linked = {job_id for _, job_id in ticks if job_id is not None}
    return {
        "ticks": len(ticks),
        "jobs": jobs.count(),
        "duplicates": max(per_minute, jobs.count() - len(linked)),
    }


@pytest.mark.slow
def test_two_then_four_workers_enqueue_each_tick_once_and_obey_pause_edit_resume(
    start_worker,
) -> None:
    env = {**FAST, "JOBS_SCHEDULES": json.dumps(CODE)}
    first_tick = echo_schedule("minute", "minute").next_run_at
    paused = echo_schedule("paused", "paused")
    edited = echo_schedule("edited", "edited-1")
    workers = [start_worker("--concurrency", "2", env=env) for _ in range(2)]
    wait_for(lambda: Schedule.objects.filter(name="code-minute").exists(), timeout=30)

    after_next_boundary()  # boundary 1: two workers
    workers += [start_worker("--concurrency", "2", env=env) for _ in range(2)]
    paused.pause("test")
    edited.args = ["edited-2"]
    edited.save()
    edited.recompute_next_run()

    after_next_boundary()  # boundary 2: four workers; "paused" skips it, "edited" has new args
    paused.resume()

    after_next_boundary()  # boundary 3: four workers; "paused" fires again, without catch-up
    wait_for(lambda: not Job.objects.filter(state__in=["pending", "running"]).exists(), 30)
    for worker in workers:
        worker.signal(signal.SIGTERM)
    for worker in workers:
        assert worker.wait() == 0, worker.output

    # Every minute from the first tick to the last boundary passed (3, or 4 if the workers
    # took until after the first boundary to start).
    last_boundary = db_now().replace(second=0, microsecond=0)
    boundaries = int((last_boundary - first_tick).total_seconds() // 60) + 1
    found = {name: counts(name) for name in ("minute", "code-minute", "paused")}
    found["edited"] = counts("edited", ["edited-1", "edited-2"])
    print(f"\n{boundaries} minute boundaries, 2 then 4 workers: {found}")
    assert boundaries >= 3
    assert found["minute"] == {"ticks": boundaries, "jobs": boundaries, "duplicates": 0}
    assert found["edited"] == found["minute"]
    code = found["code-minute"]
    assert code["ticks"] == code["jobs"] >= 3 and code["duplicates"] == 0
    # Paused across the second-to-last boundary only: that tick was neither run nor caught up.
    paused_ticks = set(
        ScheduleTick.objects.filter(schedule__name="paused").values_list("fire_at", flat=True)
    )
    assert len(paused_ticks) == boundaries - 1
    assert last_boundary in paused_ticks
    assert last_boundary - timedelta(minutes=1) not in paused_ticks
    edited_args = [job.args[0] for job in Job.objects.filter(args__0__startswith="edited")]
    assert sorted(edited_args) == ["edited-1"] * (boundaries - 2) + ["edited-2"] * 2
    assert all(job.state == "done" for job in Job.objects.all())


def start_scheduler(worker_env: dict[str, str], **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), "runjobscheduler"],
        cwd=ROOT,
        env={**worker_env, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_a_scheduler_back_after_missing_ticks_does_not_flood(worker_env) -> None:
    skip = echo_schedule("away-skip", "away-skip")
    latest = echo_schedule("away-latest", "away-latest", catch_up="latest")
    if db_now().second > 50 or db_now().second < 3:  # keep the latest tick over the grace
        after_next_boundary(margin=3)
    # The schedulers were away for ten ticks (a deploy gone wrong, say); one more is missed for
    # each minute boundary that passes before the scheduler, started on a busy machine, looks.
    started = db_now().replace(second=0, microsecond=0)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE django_jobs_schedule SET next_run_at = %s - interval '9 minutes'"
            " WHERE id IN (%s, %s)",
            [started, skip.pk, latest.pk],
        )
    scheduler = start_scheduler(worker_env, JOBS_SCHEDULE_GRACE="2", **FAST)
    try:
        wait_for(lambda: Schedule.objects.filter(last_outcome__contains="skipped").count() == 2)
    finally:
        scheduler.send_signal(signal.SIGTERM)
        output, _ = scheduler.communicate(timeout=30)
    assert scheduler.returncode == 0, output
    skip.refresh_from_db()
    latest.refresh_from_db()
    print(f"\nafter 10 missed ticks: skip={skip.last_outcome!r} latest={latest.last_outcome!r}")
    late = int((db_now().replace(second=0, microsecond=0) - started).total_seconds() // 60)
    missed = {f"skipped {10 + n} missed ticks": 10 + n for n in range(late + 1)}
    assert skip.last_outcome in missed and skip.last_job_id is None, (skip.last_outcome, late)
    # Both in the same pass: "latest" runs the last of the same missed ticks, and skips the rest.
    assert latest.last_outcome == f"enqueued (skipped {missed[skip.last_outcome] - 1} missed ticks)"
    assert Job.objects.count() == 1 and Job.objects.get().args == ["away-latest"]
    assert skip.next_run_at > datetime.now(UTC) and latest.next_run_at == skip.next_run_at
    assert "scheduler: 1 job(s) enqueued, 2 schedule(s) handled" in output
    assert "stopped: 1 job(s) enqueued" in output
