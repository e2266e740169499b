"""``manage.py syncschedules``: write the schedules declared in code into the table, and the
alert thresholds (``JOBS_ALERTS``, the tasks' expected durations) into theirs."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connections

from django_jobs import alerts, conf
from django_jobs.management.errors import database_errors
from django_jobs.schedules import declarations


class Command(BaseCommand):
    help = (
        "Sync the periodic jobs declared in code (@job(schedule=...), JOBS_SCHEDULES) into the "
        "schedules table, and print what was added, changed and marked removed; and write "
        "JOBS_ALERTS and the tasks' expected durations into the alert thresholds' table. "
        "Schedulers do this when they start; schedules made in the admin are never touched."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--check",
            action="store_true",
            help="Change nothing; exit 1 if the table is out of sync with the code.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        with database_errors(), connections[conf.database_alias()].cursor() as cursor:
            report = declarations.sync(cursor, dry_run=options["check"])
            thresholds = None if options["check"] else alerts.sync_thresholds(cursor)
        for line in report.lines():
            self.stdout.write(("would be " if options["check"] else "") + line)
        self.stdout.write(
            f"schedules {'out of sync' if not report.in_sync else 'in sync'}: {report.summary()}"
            if options["check"]
            else f"schedules synced: {report.summary()}"
        )
        if thresholds is not None:
            self.stdout.write(
                f"alert thresholds synced: {thresholds.written} written, "
                f"{thresholds.removed} removed"
            )
        if options["check"] and not report.in_sync:
            raise CommandError("the schedules table is out of sync with the code", returncode=1)
        if report.errors:
            raise CommandError(f"{len(report.errors)} invalid schedule(s) not synced")
