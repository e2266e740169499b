from __future__ import annotations

import time
from typing import Any

from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandParser
from django.db.models import Count, Max, Min

from django_jobs.models import Attempt, Job
from django_jobs.states import TERMINAL_STATES
from testproject.examples.management.commands.enqueue_examples import enqueue_examples


class Command(BaseCommand):
    help = "Enqueue the example jobs, run a worker until they are all finished, print a summary."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--count", type=int, default=4, help="Jobs of each kind (default 4).")
        parser.add_argument("--concurrency", type=int, default=4)

    def handle(self, *args: Any, **options: Any) -> None:
        started = time.monotonic()
        ids = enqueue_examples(options["count"])
        self.stdout.write(f"Enqueued {len(ids)} example jobs; starting a worker.\n")
        batch = Job.objects.filter(pk__in=ids)
        # --burst exits when nothing is ready; failed imports wait out a short retry backoff,
        # so run bursts until every job of the batch is finished.
        while batch.exclude(state__in=TERMINAL_STATES).exists():
            call_command("runjobworker", burst=True, concurrency=options["concurrency"])
            if batch.exclude(state__in=TERMINAL_STATES).exists():
                time.sleep(0.5)
        elapsed = time.monotonic() - started

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
