from __future__ import annotations

import signal
import threading
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from django_jobs import logs
from django_jobs.management.arguments import seconds
from django_jobs.management.errors import database_errors
from django_jobs.reaper import ReapReport, logger, reap_loop, reap_pass


class Command(BaseCommand):
    help = (
        "Recover running jobs whose worker is gone (no heartbeat within JOBS_WORKER_TIMEOUT, or "
        "per JOBS_LIVENESS_CHECK) or that ran past their timeout: retry them while attempts "
        "remain, else mark them error. Runs once; schedule it (cron, a Kubernetes CronJob) or "
        "use --loop, which outlasts database restarts."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--dry-run", action="store_true", help="List what would be reaped.")
        parser.add_argument(
            "--loop", action="store_true", help="Keep running, one pass per --interval."
        )
        parser.add_argument(
            "--interval",
            type=seconds(allow_zero=False),
            default=300.0,
            metavar="SECONDS",
            help="Seconds between passes with --loop (default: 300).",
        )
        parser.add_argument("--log-format", choices=["text", "json"], default="text")

    def handle(self, *args: Any, **options: Any) -> None:
        as_json = options["log_format"] == "json"
        # Text: a line per job and a summary per pass on stdout, and on stderr the log of what
        # befell the passes (the database or the Kubernetes API out of reach). JSON: all of it
        # as structured log records.
        logs.configure("INFO", options["log_format"])
        emit = None if as_json else self.stdout.write

        def summarize(report: ReapReport) -> None:
            if as_json:
                logger.info(report.summary())
            else:
                self.stdout.write(report.summary())

        with database_errors():
            if not options["loop"]:
                summarize(reap_pass(dry_run=options["dry_run"], emit=emit))
                return
            stop = threading.Event()
            for signum in (signal.SIGTERM, signal.SIGINT):
                signal.signal(signum, lambda *_: stop.set())
            reap_loop(
                options["interval"], stop, dry_run=options["dry_run"], emit=emit, on_pass=summarize
            )
