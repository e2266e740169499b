from __future__ import annotations

import argparse
import time
from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from django_jobs import conf
from django_jobs.management.arguments import whole_number
from django_jobs.management.errors import database_errors
from django_jobs.prune import PruneResult, check_states, prune


def _duration(value: str) -> timedelta:
    try:
        return conf.parse_duration(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _states(value: str) -> tuple[str, ...]:
    try:
        return check_states(value.split(","))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


class Command(BaseCommand):
    help = (
        "Delete finished jobs older than a retention period, with their attempts and dependency "
        "rows, in small batches. Jobs that an unfinished job depends on or descends from are "
        "kept. Defaults come from JOBS_RETENTION (finished more than 14 days ago; done, "
        "cancelled and error). The hours that have closed are rolled up first (see "
        "rollupjobs), no job finished after the rollups' watermark is deleted, and hourly "
        "rollups older than JOBS_ROLLUP_RETENTION (400d) go too."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--older-than",
            type=_duration,
            default=None,
            metavar="AGE",
            help="Delete jobs that finished more than AGE ago: 90s, 15m, 12h, 14d, 2w "
            "(default: JOBS_RETENTION's older_than, 14d).",
        )
        parser.add_argument(
            "--state",
            type=_states,
            default=None,
            metavar="A,B",
            help="Finished states to delete, comma-separated: done, cancelled, error "
            "(default: JOBS_RETENTION's states, all three).",
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="Count what would be deleted; change nothing."
        )
        parser.add_argument(
            "--batch-size",
            type=whole_number(1, 100_000),
            default=1000,
            metavar="N",
            help="Jobs per batch; each batch is one short transaction (default: 1000).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        verbosity = options["verbosity"]
        last_report = time.monotonic()

        def progress(result: PruneResult) -> None:
            # Long runs report every few seconds; -v 2 reports every batch.
            nonlocal last_report
            if verbosity >= 2 or (verbosity >= 1 and time.monotonic() - last_report >= 5):
                last_report = time.monotonic()
                verb = "would delete" if result.dry_run else "deleted"
                self.stdout.write(
                    f"… batch {result.batches}: {verb} {result.jobs} job(s) so far, "
                    f"kept {result.kept} ({result.jobs / max(result.elapsed, 1e-3):.0f} jobs/s)"
                )

        with database_errors():
            result = prune(
                older_than=options["older_than"],
                states=options["state"],
                dry_run=options["dry_run"],
                batch_size=options["batch_size"],
                progress=progress,
            )
        if verbosity >= 1:
            self.stdout.write(("dry run: " if result.dry_run else "") + result.summary())
