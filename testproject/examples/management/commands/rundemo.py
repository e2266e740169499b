"""``manage.py rundemo``: enqueue the example jobs, let a worker run them and fire the demo's
periodic job, then print a summary."""

from __future__ import annotations

import io
import secrets
import time
from datetime import timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandParser
from django.db.models import Count, Max, Min
from django.db.models.functions import Now
from django.test import override_settings

from django_jobs.models import Attempt, Job, Schedule, ScheduleTick
from django_jobs.states import TERMINAL_STATES
from testproject.examples.management.commands.enqueue_examples import enqueue_examples

#: The demo's periodic job, declared as ``JOBS_SCHEDULES`` in settings would declare it: here,
#: and only while the demo runs, so that the test suite's workers fire no schedule.
DEMO_SCHEDULE = "demo-every-minute"
DEMO_SCHEDULES = {
    DEMO_SCHEDULE: {
        "task": "testproject.examples.jobs.checksum",
        "cron": "* * * * *",
        "args": ["tick"],
        "kwargs": {"rounds": 1000},
        "catch_up": "latest",
    }
}


class Command(BaseCommand):
    help = (
        "Enqueue the example jobs, run a worker until they are all finished (it also fires the "
        "demo's periodic job), print a summary."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--count", type=int, default=4, help="Jobs of each kind (default 4).")
        parser.add_argument("--concurrency", type=int, default=4)

    @override_settings(JOBS_SCHEDULES=DEMO_SCHEDULES)
    def handle(self, *args: Any, **options: Any) -> None:
        started = time.monotonic()
        schedule = self.miss_a_tick()
        ids = enqueue_examples(options["count"])
        self.stdout.write(f"Enqueued {len(ids)} example jobs; starting a worker.\n")
        # --burst-wait: the worker also waits for the failed imports' retries, whose backoff
        # is short, and exits once everything is finished.
        while self.unfinished(Job.objects.filter(pk__in=ids), schedule):
            call_command(
                "runjobworker", burst=True, burst_wait=30, concurrency=options["concurrency"]
            )
        elapsed = time.monotonic() - started
        # What the worker ran: the example jobs and the schedule's job.
        schedule.refresh_from_db()
        if schedule.last_job_id is not None:
            ids.append(schedule.last_job_id)
        batch = Job.objects.filter(pk__in=ids)

        self.stdout.write("\nSummary")
        self.stdout.write(f"{'task':<40} {'state':<10} {'jobs':>5} {'attempts':>9}")
        rows = (
            batch.values("task", "state")
            .annotate(jobs=Count("id", distinct=True), attempts=Count("attempts"))
            .order_by("task", "state")
        )
        for row in rows:
            self.stdout.write(
                f"{row['task']:<40} {row['state']:<10} {row['jobs']:>5} {row['attempts']:>9}"
            )
        span = Attempt.objects.filter(job__in=ids).aggregate(Min("started_at"), Max("finished_at"))
        failed = Attempt.objects.filter(job__in=ids).exclude(outcome="done").count()
        self.stdout.write(
            f"\n{len(ids)} jobs finished in {elapsed:.1f}s ({failed} failed attempts retried or "
            f"recorded); first start {span['started_at__min']:%H:%M:%S}, "
            f"last finish {span['finished_at__max']:%H:%M:%S}."
        )
        example = batch.filter(task__endswith="build_report", state="done").first()
        if example is not None:
            self.stdout.write(f"Example result of job #{example.pk}: {example.result}")
        self.report_progress(batch)
        self.report(schedule)
        self.next_steps()

    def next_steps(self) -> None:
        """How to look at what just ran: the admin, with a superuser to log in as."""
        User = get_user_model()
        created = ""
        if not User.objects.filter(is_superuser=True).exists():
            password = secrets.token_urlsafe(12)
            User.objects.create_superuser("admin", "admin@example.com", password)
            created = f" (log in as admin, password {password}: a superuser the demo created)"
        self.stdout.write(
            "\nnext: python3 scripts/dev.py manage runserver, and open "
            f"http://127.0.0.1:8000/admin/django_jobs/job/{created}"
        )

    def report_progress(self, batch: Any) -> None:
        """The catalog sync's progress and the end of its captured log."""
        job = batch.filter(task__endswith="sync_catalog").first()
        if job is None:
            return
        shown = job.progress
        if shown is not None:
            self.stdout.write(
                f"Job #{job.pk} ({job.task}) reported progress {shown.percent} "
                f"({shown.message!r}); its attempt's captured log ends:"
            )
        for line in job.attempts.order_by("number").last().log.splitlines()[-3:]:
            self.stdout.write(f"    {line}")

    def miss_a_tick(self) -> Schedule:
        """Sync the demo's schedule, then make it look as if no scheduler had run for two
        minutes: with ``catch_up="latest"`` the worker's scheduler fires the latest missed tick
        at once, instead of the demo waiting for the next minute. Its earlier ticks are
        forgotten, so that a rerun within the same minute fires too (a tick enqueues once)."""
        call_command("syncschedules", stdout=io.StringIO())
        ScheduleTick.objects.filter(schedule__name=DEMO_SCHEDULE).delete()
        due = Schedule.objects.filter(name=DEMO_SCHEDULE)
        due.update(next_run_at=Now() - timedelta(minutes=2), last_job_id=None, last_run_at=None)
        schedule = due.get()
        self.stdout.write(
            f"Schedule {schedule.name!r} ({schedule.cron}, catch_up {schedule.catch_up!r}) "
            f"missed its ticks of the last two minutes; the worker's scheduler will fire the "
            f"latest one."
        )
        return schedule

    def unfinished(self, batch: Any, schedule: Schedule) -> bool:
        """Whether a job of the batch, or the schedule's job once fired, is still to finish."""
        schedule.refresh_from_db()
        ids = [schedule.last_job_id] if schedule.last_job_id else []
        jobs = batch | Job.objects.filter(pk__in=ids)
        return bool(jobs.exclude(state__in=TERMINAL_STATES).exists())

    def report(self, schedule: Schedule) -> None:
        schedule.refresh_from_db()
        job = Job.objects.filter(pk=schedule.last_job_id).first()
        fired = (
            f"its tick of {schedule.last_run_at:%H:%M:%S} ran as job #{job.pk} ({job.state})"
            if job is not None and schedule.last_run_at is not None
            else "it did not fire"
        )
        next_run = f"{schedule.next_run_at:%H:%M:%S}" if schedule.next_run_at else "-"
        self.stdout.write(
            f"Schedule {schedule.name!r}: {fired}; last outcome: {schedule.last_outcome!r}; "
            f"next run {next_run}."
        )
