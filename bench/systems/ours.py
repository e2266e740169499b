"""django-jobs itself, run the way users run it: ``manage.py runjobworker --burst``.

The workers use ``bench.settings`` (the test project plus the ``bench`` jobs) and their default
logging (one line per claimed and per finished job, at INFO).
"""

from __future__ import annotations

import os
import sys
import time

from bench.core import ROOT, Context, Workload, django_setup, emit, python_env, run_json
from bench.systems.base import System, helper_parser


class Ours(System):
    key = "ours"
    label = "django-jobs"
    jobs_table = "django_jobs_job"
    tables = ("django_jobs_job", "django_jobs_attempt", "django_jobs_worker")
    finished_sql = (
        "SELECT extract(epoch FROM finished_at) AS t FROM django_jobs_job WHERE state = 'done'"
    )
    failed_sql = "SELECT count(*) FROM django_jobs_job WHERE state IN ('error', 'cancelled')"

    def env(self, ctx: Context) -> dict[str, str]:
        return python_env(DATABASE_URL=self.url(ctx), DJANGO_SETTINGS_MODULE="bench.settings")

    def install(self, ctx: Context) -> None:
        run_json(self.helper(ctx, "install"), self.env(ctx))

    def worker_commands(
        self, ctx: Context, workload: Workload, slots: int, processes: int
    ) -> list[list[str]]:
        per_process = max(1, slots // processes)
        command = [
            ctx.python,
            str(ROOT / "manage.py"),
            "runjobworker",
            "--burst",
            "--concurrency",
            str(per_process),
            "--worker-id",
            "bench",
        ]
        return [command for _ in range(processes)]


# ------------------------------------------------------------------ the helper process


def enqueue_bench(single: int, bulk: int) -> dict[str, float]:
    from bench.jobs import noop

    start = time.perf_counter()
    for i in range(single):
        noop.enqueue(i)  # autocommit: each in its own transaction
    single_rate = single / (time.perf_counter() - start)

    start = time.perf_counter()
    noop.enqueue_many(((i,), {}) for i in range(bulk))
    bulk_rate = bulk / (time.perf_counter() - start)
    return {"single": single_rate, "bulk": bulk_rate}


def main(argv: list[str] | None = None) -> None:
    parser, _ = helper_parser("python -m bench.systems.ours")
    args = parser.parse_args(argv)
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"
    django_setup()

    if args.command == "install":
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        emit({"installed": True})
    elif args.command == "enqueue-one":
        from bench.jobs import noop, sleep

        job = sleep.enqueue(args.seconds) if args.seconds else noop.enqueue()
        emit({"enqueued": job.pk})
    elif args.command == "enqueue-bench":
        emit(enqueue_bench(args.single, args.bulk))


if __name__ == "__main__":
    main(sys.argv[1:])
