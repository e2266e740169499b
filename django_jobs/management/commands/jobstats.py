from __future__ import annotations

import contextlib
import signal
import sys
import threading
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, connections

from django_jobs import conf
from django_jobs.management.arguments import seconds, whole_number
from django_jobs.management.errors import database_errors
from django_jobs.store import operations_views as stats


class Command(BaseCommand):
    help = (
        "Show the job queues: per queue, jobs by state, the oldest ready and running jobs, "
        "throughput and failures of the last minutes, live workers and stuck jobs."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--watch",
            type=seconds(allow_zero=False),
            nargs="?",
            const=2.0,
            default=None,
            metavar="SECONDS",
            help="Refresh every SECONDS (default 2) until Ctrl-C. A refresh that fails (the "
            "database away) prints one line to stderr, and the next one tries again.",
        )
        parser.add_argument(
            "--json",
            action="store_true",
            help="Print the summary as JSON (with --watch: one object per line).",
        )
        parser.add_argument(
            "--window",
            type=whole_number(1, 1440, "whole minutes"),
            default=15,
            metavar="MINUTES",
            help="Minutes over which throughput and failures are counted (default 15).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        stop = threading.Event()
        if options["watch"] is not None:
            for signum in (signal.SIGINT, signal.SIGTERM):
                signal.signal(signum, lambda *_: stop.set())
        clear = options["watch"] is not None and not options["json"] and sys.stdout.isatty()
        shown = False
        while True:
            try:
                with database_errors():
                    data = stats.summary(options["window"])
            except CommandError as error:
                if not shown:
                    raise
                # Watching: an outage is a line, and the next refresh tries again, on new
                # connections (a broken one would fail every refresh after).
                self.stderr.write(str(error))
                for alias in {stats.read_alias(), conf.database_alias()}:
                    with contextlib.suppress(DatabaseError):
                        connections[alias].close()
                if stop.wait(options["watch"]):
                    return
                continue
            shown = True
            output = stats.to_json(data) if options["json"] else stats.render(data)
            if clear:
                self.stdout.write("\033[H\033[2J", ending="")
            self.stdout.write(output)
            if options["watch"] is None:
                return
            if not options["json"] and not clear:
                self.stdout.write("")  # a blank line between refreshes
            self.stdout.flush()
            if stop.wait(options["watch"]):
                return
