from __future__ import annotations

import argparse
import logging
import os
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_jobs import apiclient, checks, conf, logs
from django_jobs.exceptions import ApiRefused, InvalidOption
from django_jobs.management.arguments import add_log_arguments, seconds, whole_number
from django_jobs.management.errors import unnamed_queues, wait_for_tables
from django_jobs.worker import http_queue
from django_jobs.worker.background_log import BackgroundLog
from django_jobs.worker.supervisor import Supervisor

logger = logging.getLogger("django_jobs.worker")


def _queue_list(value: str) -> list[str]:
    queues = [q.strip() for q in value.split(",") if q.strip()]
    if not queues:
        raise argparse.ArgumentTypeError("name at least one queue, e.g. --queues default,reports")
    return queues


class Command(BaseCommand):
    # An invalid periodic job is logged by the scheduler and left out, not a reason to stop.
    requires_system_checks = checks.but_schedules()
    help = (
        "Run a job worker: claim ready jobs and run them in executor processes. "
        "SIGTERM or Ctrl-C stops claiming and lets running jobs finish within --grace; "
        "a second signal exits at once."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--queues",
            type=_queue_list,
            default=None,
            metavar="A,B",
            help="Comma-separated queues to serve (default: every queue).",
        )
        parser.add_argument(
            "--concurrency",
            type=whole_number(1),
            default=1,
            metavar="N",
            help="Jobs run in parallel, each in its own executor process (default: 1).",
        )
        parser.add_argument(
            "--worker-id",
            default=None,
            metavar="NAME",
            help="Base name of this worker's id (default: JOBS_WORKER_ID, POD_NAME or the host "
            "name). The pid and a short random id are appended.",
        )
        parser.add_argument(
            "--burst",
            action="store_true",
            help="Exit once no job is ready and none is running. Retries waiting out their "
            "backoff, and jobs delayed to later, are left for another worker (see --burst-wait).",
        )
        parser.add_argument(
            "--burst-wait",
            type=seconds(allow_zero=False),
            default=None,
            metavar="SECONDS",
            help="With --burst: drain everything, also waiting for pending jobs that become "
            "ready within SECONDS (retries in their backoff, delayed jobs) before exiting.",
        )
        parser.add_argument(
            "--alive-file",
            metavar="PATH",
            help="Touch PATH on every turn of the worker's loop (at least once per heartbeat "
            "interval), for a liveness probe: a frozen worker stops touching it, a database "
            "outage does not (see deploy/kubernetes/worker.yaml).",
        )
        parser.add_argument(
            "--max-jobs",
            type=whole_number(1),
            default=None,
            metavar="N",
            help="Exit after claiming N jobs (and finishing them).",
        )
        parser.add_argument(
            "--poll-interval",
            type=seconds(allow_zero=True),
            default=None,
            metavar="SECONDS",
            help="Seconds between looks for ready jobs when idle (default: JOBS_POLL_INTERVAL, 1).",
        )
        parser.add_argument(
            "--no-listen",
            action="store_true",
            help="Don't LISTEN for enqueue notifications; find jobs by polling only "
            "(default: JOBS_LISTEN, on).",
        )
        parser.add_argument(
            "--no-scheduler",
            action="store_true",
            help="Don't fire periodic jobs from this worker (default: it does, like every "
            "worker; each tick enqueues once however many do).",
        )
        parser.add_argument(
            "--grace",
            type=seconds(allow_zero=True),
            default=25.0,
            metavar="SECONDS",
            help="On SIGTERM, how long running jobs may go on before they are stopped and "
            "released back to the queue (default: 25, under Kubernetes' 30).",
        )
        parser.add_argument(
            "--api",
            default=None,
            metavar="URL",
            help="Take jobs from the jobs HTTP API at URL (e.g. https://app/jobs/api/) instead of "
            "the jobs database: the worker opens no connection to it (a job's own code may "
            "still use the app's databases). Implies --no-listen and --no-scheduler.",
        )
        parser.add_argument(
            "--token-file",
            default=None,
            metavar="PATH",
            help="With --api: the file holding the API token (`manage.py createjobtoken`), read "
            f"once at start (default: the environment variable {apiclient.TOKEN_VARIABLE}).",
        )
        parser.add_argument(
            "--api-wait",
            type=seconds(allow_zero=True),
            default=10.0,
            metavar="SECONDS",
            help="With --api: how long an idle worker's claim waits on the server for a job "
            f"(long polling; default: 10, at most {apiclient.MAX_WAIT:g}). A SIGTERM that comes "
            "during the wait is acted on when it ends.",
        )
        add_log_arguments(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        logs.configure(options["log_level"], options["log_format"])
        api = options["api"]
        if api is None and options["token_file"] is not None:
            raise CommandError("--token-file goes with --api URL")
        if options["burst_wait"] is not None and not options["burst"]:
            raise CommandError("--burst-wait goes with --burst")
        if options["burst_wait"] is not None and api is not None:
            raise CommandError(
                "--burst-wait needs the database: a worker of the HTTP API cannot see jobs "
                "that are not ready yet"
            )
        queue = None
        alias = None if api is not None else conf.database_alias()
        if alias is not None and not wait_for_tables(alias, burst=options["burst"], logger=logger):
            return  # stopped by a signal while waiting for the database
        for name in unnamed_queues(options["queues"] or (), alias):
            logger.warning(
                "queue %r is named by nothing: no JOBS_QUEUES or JOBS_QUEUE_LIMITS entry, "
                "registered task, periodic job, job or queue control; this worker will find "
                "no jobs there unless something enqueues to it (a typo in --queues?)",
                name,
            )
        if api is not None:
            try:
                queue = http_queue.open_queue(api, options["token_file"], os.environ)
            except InvalidOption as exc:
                raise CommandError(str(exc)) from None
            # The executors' job contexts use the API too (JobContext.is_cancelled, spawn).
            os.environ[apiclient.URL_VARIABLE] = queue.api.url
            os.environ[apiclient.TOKEN_VARIABLE] = queue.api.token
        supervisor = Supervisor(
            queues=options["queues"],
            concurrency=options["concurrency"],
            name=options["worker_id"],
            burst=options["burst"],
            burst_wait=options["burst_wait"] or 0.0,
            alive_file=options["alive_file"],
            max_jobs=options["max_jobs"],
            poll_interval=options["poll_interval"],
            grace=options["grace"],
            listen=False if options["no_listen"] or queue else None,
            scheduler=not (options["no_scheduler"] or queue),
            db=queue,
            long_poll=min(options["api_wait"], apiclient.MAX_WAIT) if queue else 0.0,
        )
        if queue is not None:
            try:
                queue.check(supervisor.info)
            except ApiRefused as exc:
                queue.close()
                raise CommandError(f"the worker cannot start: {exc}") from None
        with BackgroundLog():  # a blocked log output must not stop the loop
            code = supervisor.run()
        if code:
            raise CommandError("worker stopped by a second signal", returncode=code)
