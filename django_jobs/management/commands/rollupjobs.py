from __future__ import annotations

import time
from typing import Any

from django.core.management.base import BaseCommand

from django_jobs import rollups
from django_jobs.management.errors import database_errors


class Command(BaseCommand):
    help = (
        "Roll up the finished jobs and ended attempts of every closed UTC hour not yet rolled "
        "up: counts by outcome, durations, attempts and waits per hour, queue and task, kept "
        "after prunejobs has deleted the jobs (django_jobs_rollup; all-time totals in "
        "django_jobs_rollup_total). Workers do this on their own every JOBS_ROLLUP_INTERVAL "
        "seconds, and prunejobs does it before it deletes anything; run this from cron where "
        "workers run with JOBS_ROLLUP_INTERVAL = 0. Safe to run at any time, from any number "
        "of processes: each hour is rolled up once."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        verbosity = options["verbosity"]
        last_report = time.monotonic()

        def progress(result: rollups.RollupResult) -> None:
            nonlocal last_report
            if verbosity >= 2 or (verbosity >= 1 and time.monotonic() - last_report >= 5):
                last_report = time.monotonic()
                self.stdout.write(f"… {result.passes} pass(es), {result.rows} hourly row(s)")

        with database_errors():
            result = rollups.roll_up(progress=progress)
        if verbosity >= 1:
            self.stdout.write(result.summary())
