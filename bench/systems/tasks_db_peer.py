"""django-tasks-db, run with its own ``db_worker``: one process runs one task at a time, so N
slots are N worker processes. It claims one task per transaction through the ORM.
It has no bulk enqueue API.
"""

from __future__ import annotations

import sys
import time

from bench.core import Context, Workload, django_setup, emit, python_env
from bench.systems.base import System, helper_parser

SETTINGS = "bench.systems.tasks_db_settings"


class TasksDB(System):
    key = "tasks_db"
    label = "django-tasks-db"
    requires = "django_tasks_db"
    jobs_table = "django_tasks_database_dbtaskresult"
    tables = ("django_tasks_database_dbtaskresult",)
    finished_sql = (
        "SELECT extract(epoch FROM finished_at) AS t FROM django_tasks_database_dbtaskresult"
        " WHERE status = 'SUCCESSFUL'"
    )
    failed_sql = "SELECT count(*) FROM django_tasks_database_dbtaskresult WHERE status = 'FAILED'"

    def env(self, ctx: Context) -> dict[str, str]:
        return python_env(DATABASE_URL=self.url(ctx), DJANGO_SETTINGS_MODULE=SETTINGS)

    def worker_commands(
        self, ctx: Context, workload: Workload, slots: int, processes: int
    ) -> list[list[str]]:
        # db_worker runs one task at a time: a slot is a process.
        command = [ctx.python, "-m", "django", "db_worker", "--batch", "--no-startup-delay"]
        return [command for _ in range(slots)]


# ------------------------------------------------------------------ the helper process


def enqueue_bench(single: int, bulk: int) -> dict[str, float | None]:
    from bench.systems.tasks_db_tasks import noop

    start = time.perf_counter()
    for i in range(single):
        noop.enqueue(i)
    single_rate = single / (time.perf_counter() - start)
    return {"single": single_rate, "bulk": None}


def main(argv: list[str] | None = None) -> None:
    parser, _ = helper_parser("python -m bench.systems.tasks_db_peer")
    args = parser.parse_args(argv)
    django_setup(SETTINGS)

    if args.command == "install":
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        emit({"installed": True})
    elif args.command == "enqueue-one":
        from bench.systems.tasks_db_tasks import noop, sleep

        result = sleep.enqueue(args.seconds) if args.seconds else noop.enqueue()
        emit({"enqueued": str(result.id)})
    elif args.command == "enqueue-bench":
        emit(enqueue_bench(args.single, args.bulk))


if __name__ == "__main__":
    main(sys.argv[1:])
