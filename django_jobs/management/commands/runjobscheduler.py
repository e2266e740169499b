"""``manage.py runjobscheduler``: fire periodic jobs, without running any (workers do that)."""

from __future__ import annotations

import logging
import signal
import threading
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from django_jobs import checks, conf, logs
from django_jobs.management.arguments import add_log_arguments, seconds
from django_jobs.management.errors import wait_for_tables
from django_jobs.runtime.identity import base_name, new_worker_id
from django_jobs.schedules.runner import Scheduler
from django_jobs.store.connection import QueueConnection
from django_jobs.worker.duties import PostgresDuties
from django_jobs.worker.postgres_queue import PostgresQueue, QueueGate

logger = logging.getLogger("django_jobs.schedules")


class Command(BaseCommand):
    # An invalid periodic job is logged by the scheduler and left out, not a reason to stop.
    requires_system_checks = checks.but_schedules()
    help = (
        "Fire periodic jobs: sync the schedules declared in code, then enqueue each due tick "
        "(once, however many schedulers and workers run; workers fire them too unless started "
        "with --no-scheduler). SIGTERM or Ctrl-C stops it between ticks."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--interval",
            type=seconds(allow_zero=False),
            default=None,
            metavar="SECONDS",
            help="Longest sleep between looks at the schedules, so that edits are noticed "
            "(default: JOBS_SCHEDULER_INTERVAL, 30).",
        )
        add_log_arguments(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        logs.configure(options["log_level"], options["log_format"])
        if not wait_for_tables(conf.database_alias(), burst=False, logger=logger, what="scheduler"):
            return  # stopped by a signal while waiting for the database
        name = new_worker_id(base_name(None))
        connection = QueueConnection(conf.database_alias(), f"scheduler:{name}")
        queue = PostgresQueue(connection)
        scheduler = Scheduler(
            PostgresDuties(connection), QueueGate(queue), interval=options["interval"]
        )
        stop = threading.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())
        logger.info(
            "scheduler %s starting: %d task(s) registered, looking at least every %.0fs",
            name,
            len(scheduler.tasks),
            scheduler.interval,
        )
        try:
            while not stop.is_set():
                done = scheduler.step()
                if done is not None and done.handled:
                    logger.info(
                        "scheduler: %d job(s) enqueued, %d schedule(s) handled; %d in all; "
                        "next look in %.1fs",
                        done.fired,
                        done.handled,
                        scheduler.fired,
                        max(0.0, scheduler.due_at - time.monotonic()),
                    )
                stop.wait(max(0.0, scheduler.due_at - time.monotonic()))
        finally:
            queue.close()
        logger.info("scheduler %s stopped: %d job(s) enqueued", name, scheduler.fired)
