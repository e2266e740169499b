"""``manage.py jobsalerts``: print the alerts that fire, and exit non-zero while any does."""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser, SystemCheckError

from django_jobs import alerts
from django_jobs.management.errors import database_errors

#: Exit codes, as ``--help`` lists them: as grep's, an answer (0 or 1) or no answer (2).
QUIET, FIRING, UNKNOWN = 0, 1, 2

EPILOG = """\
exit codes: 0 no alert fires; 1 at least one fires (of --severity or worse); 2 no answer: the
database could not be read (down, or not migrated), a setting fails its system check
(JOBS_ALERTS, say), or the options are wrong.

examples:
  manage.py jobsalerts                       # every alert, critical ones first
  manage.py jobsalerts --severity critical   # a probe that fails on critical alerts only
  manage.py jobsalerts --json                # for scripts
"""


class Command(BaseCommand):
    help = (
        "Print the alerts of the django_jobs_alerts view (a schedule that has not succeeded "
        "in time, an overdue job, a queue whose oldest ready job waits too long or that no "
        "live worker serves, jobs that used up their attempts) and exit 1 while any fires."
    )

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        parser = super().create_parser(prog_name, subcommand, **kwargs)
        parser.epilog = EPILOG
        parser.formatter_class = argparse.RawDescriptionHelpFormatter
        return parser

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--json",
            action="store_true",
            help='Print one JSON object: {"generated_at": ..., "alerts": [...]}, a row of the '
            "view per alert.",
        )
        parser.add_argument(
            "--severity",
            choices=alerts.SEVERITIES,
            default="warning",
            help="The lowest severity printed and counted for the exit code (default warning: "
            "all).",
        )
        parser.add_argument(
            "--no-sync",
            action="store_true",
            help="Do not write JOBS_ALERTS and the tasks' expected durations into the view's "
            "threshold table first (for a role that may only read).",
        )

    def execute(self, *args: Any, **options: Any) -> Any:
        try:
            return super().execute(*args, **options)
        except SystemCheckError as error:
            error.returncode = UNKNOWN  # a bad setting is no answer, not an alert that fires
            raise

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            with database_errors():
                if not options["no_sync"]:
                    alerts.sync_thresholds()
                found = alerts.firing(severity=options["severity"])
        except CommandError as error:
            raise CommandError(str(error), returncode=UNKNOWN) from error
        self.stdout.write(alerts.to_json(found) if options["json"] else alerts.render(found))
        if found.alerts:
            raise CommandError(f"{len(found.alerts)} alert(s) firing", returncode=FIRING)
