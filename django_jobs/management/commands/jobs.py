"""``manage.py jobs``: list, show, follow, retry, cancel and enqueue jobs from the shell."""

from __future__ import annotations

import argparse
import json
import signal
import threading
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from django_jobs import conf, operator_actions
from django_jobs.exceptions import JobsError
from django_jobs.management.arguments import add_subcommand, seconds, whole_number
from django_jobs.management.errors import database_errors
from django_jobs.models.attempt import Attempt
from django_jobs.models.job import Job
from django_jobs.progress import Shown, count
from django_jobs.registry import registry
from django_jobs.sanitize import mask_text, mask_value
from django_jobs.states import State

#: Exit codes, as ``--help`` lists them.
OK, REFUSED, USAGE = 0, 1, 2

EXAMPLES = """\
examples:
  manage.py jobs list --state error --queue imports
  manage.py jobs list --task myapp.jobs.send_report --json
  manage.py jobs show 42
  manage.py jobs logs 42 --follow
  manage.py jobs retry 42 43
  manage.py jobs cancel 44
  manage.py jobs enqueue myapp.jobs.send_report --args '[7]' --kwargs '{"to": "ops"}' \\
      --queue reports --priority 10 --run-after 10m
  manage.py jobs tasks

exit codes: 0 done; 1 refused (a job not found, or not in a state the action applies to);
2 usage or invalid input (bad JSON, an unknown task or option).
"""


class Command(BaseCommand):
    help = (
        "Job control from the shell: list, show, follow the log of, retry, cancel and enqueue "
        "jobs, and list the registered tasks. Retry and cancel follow the admin actions' rules."
    )

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        parser = super().create_parser(prog_name, subcommand, **kwargs)
        parser.epilog = EXAMPLES
        parser.formatter_class = argparse.RawDescriptionHelpFormatter
        return parser

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")

        listing = add_subcommand(actions, parser, "list", help="Jobs, newest first.")
        listing.add_argument(
            "--state",
            action="append",
            choices=[s.value for s in State],
            help="Only jobs in this state (repeat for several).",
        )
        listing.add_argument("--queue", action="append", help="Only this queue (repeatable).")
        listing.add_argument("--task", action="append", help="Only this task (repeatable).")
        listing.add_argument(
            "--limit",
            type=whole_number(1, 100_000),
            default=50,
            help="At most this many jobs (default 50).",
        )
        listing.add_argument("--json", action="store_true", help="One JSON array, for scripts.")

        show = add_subcommand(
            actions, parser, "show", help="A job, with its attempts and tracebacks, masked."
        )
        show.add_argument("job_id", type=whole_number(1), metavar="ID")
        show.add_argument("--json", action="store_true", help="One JSON object, for scripts.")

        logs = add_subcommand(actions, parser, "logs", help="The log of a job's latest attempt.")
        logs.add_argument("job_id", type=whole_number(1), metavar="ID")
        logs.add_argument("--attempt", type=whole_number(1), help="This attempt's log instead.")
        logs.add_argument(
            "--follow",
            "-f",
            action="store_true",
            help="Keep printing new lines until the job ends (Ctrl-C stops).",
        )
        logs.add_argument(
            "--interval",
            type=seconds(allow_zero=False),
            default=1.0,
            help="With --follow: seconds between reads (default 1).",
        )

        retry = add_subcommand(
            actions, parser, "retry", help="Requeue jobs in error or cancelled (as the admin)."
        )
        retry.add_argument("job_ids", nargs="+", type=whole_number(1), metavar="ID")
        cancel = add_subcommand(
            actions,
            parser,
            "cancel",
            help="Cancel jobs: pending and waiting at once, running ones asked to stop.",
        )
        cancel.add_argument("job_ids", nargs="+", type=whole_number(1), metavar="ID")

        enqueue = add_subcommand(
            actions, parser, "enqueue", help="Enqueue a registered task, as enqueue() does."
        )
        enqueue.add_argument("task", help="The task's registered name (see: jobs tasks).")
        enqueue.add_argument(
            "--args", dest="call_args", default="[]", help="A JSON array (default [])."
        )
        enqueue.add_argument(
            "--kwargs", dest="call_kwargs", default="{}", help="A JSON object (default {})."
        )
        enqueue.add_argument("--queue", help="Another queue than the task's.")
        enqueue.add_argument("--priority", type=int, help="-100 to 100; higher runs first.")
        enqueue.add_argument(
            "--run-after",
            help="When it may run: an ISO 8601 time with its offset, or a delay such as 90s, "
            "10m, 2h or 1d.",
        )
        enqueue.add_argument("--unique-key", help="Skip if an active job holds this key.")

        tasks = add_subcommand(actions, parser, "tasks", help="The registered tasks and options.")
        tasks.add_argument("--json", action="store_true", help="One JSON array, for scripts.")

    def handle(self, *args: Any, **options: Any) -> None:
        action = options["action"]
        handler = getattr(self, f"_{action}")
        with database_errors():  # one line naming migrate, or the database out of reach
            handler(options)

    # ------------------------------------------------------------------------- reading

    def _jobs(self) -> Any:
        return Job.objects.using(conf.database_alias())

    def _job(self, job_id: int) -> Job:
        try:
            return self._jobs().get(pk=job_id)
        except Job.DoesNotExist:
            raise CommandError(f"no job #{job_id}", returncode=REFUSED) from None

    def _list(self, options: dict[str, Any]) -> None:
        jobs = self._jobs().order_by("-id")
        if options["state"]:
            jobs = jobs.filter(state__in=options["state"])
        if options["queue"]:
            jobs = jobs.filter(queue__in=options["queue"])
        if options["task"]:
            jobs = jobs.filter(task__in=options["task"])
        rows = list(jobs[: options["limit"]])
        if options["json"]:
            self._json([_summary(job) for job in rows])
            return
        table = [("ID", "STATE", "QUEUE", "TASK", "ATTEMPT", "CREATED", "ERROR")]
        for job in rows:
            table.append(
                (
                    str(job.pk),
                    job.state,
                    job.queue,
                    job.task,
                    f"{job.attempt}/{job.max_attempts}",
                    _when(job.created_at),
                    _one_line(mask_text(job.error), 60),
                )
            )
        self._table(table)
        if not rows:
            self.stderr.write("no jobs match")

    def _show(self, options: dict[str, Any]) -> None:
        job = self._job(options["job_id"])
        attempts = list(
            Attempt.objects.using(conf.database_alias()).filter(job_id=job.pk).order_by("number")
        )
        shown = _details(job, attempts)
        if options["json"]:
            self._json(shown)
            return
        for key, value in shown.items():
            if key in {"attempts", "args", "kwargs", "result"}:
                continue
            if value not in (None, "", []):
                self.stdout.write(f"{key + ':':<20}{value}")
        for key in ("args", "kwargs", "result"):
            if shown[key] is not None:
                text = json.dumps(shown[key], indent=2, sort_keys=True, ensure_ascii=False)
                self.stdout.write(f"{key}:\n{_indent(text)}")
        for attempt in shown["attempts"]:
            head = (
                f"attempt {attempt['number']}: {attempt['outcome']} on {attempt['worker_id']}, "
                f"{attempt['started_at']} to {attempt['finished_at'] or '-'}"
            )
            self.stdout.write(head)
            if attempt["error"]:
                self.stdout.write(_indent(attempt["error"]))
            if attempt["traceback"]:
                self.stdout.write(_indent(attempt["traceback"].rstrip("\n")))

    def _logs(self, options: dict[str, Any]) -> None:
        job = self._job(options["job_id"])
        number = options["attempt"]
        printed: tuple[int, str] | None = None
        stop = threading.Event()
        if options["follow"]:
            # Ctrl-C or SIGTERM ends a follow as its end would: what was printed stands.
            for signum in (signal.SIGINT, signal.SIGTERM):
                signal.signal(signum, lambda *_: stop.set())
        while not stop.is_set():
            attempt = _attempt(job.pk, number)
            if attempt is None and number is not None:
                raise CommandError(f"job #{job.pk} has no attempt {number}", returncode=REFUSED)
            if attempt is not None:
                log = mask_text(attempt.log)
                if printed is None or printed[0] != attempt.number:
                    if printed is not None or options["follow"]:
                        self.stderr.write(f"--- job #{job.pk}, attempt {attempt.number}")
                    self.stdout.write(log, ending="")
                else:
                    self.stdout.write(_new_text(printed[1], log), ending="")
                self.stdout.flush()
                printed = (attempt.number, log)
            if not options["follow"]:
                if attempt is None:
                    self.stderr.write(f"job #{job.pk} has not run yet")
                return
            job.refresh_from_db(fields=["state"])
            if job.state in (State.DONE, State.ERROR, State.CANCELLED) and attempt_is_last(
                job.pk, printed
            ):
                self.stderr.write(f"--- job #{job.pk} ended {job.state}")
                return
            stop.wait(options["interval"])

    # ------------------------------------------------------------------------- changing

    def _retry(self, options: dict[str, Any]) -> None:
        self._act(options["job_ids"], operator_actions.retry, "requeued")

    def _cancel(self, options: dict[str, Any]) -> None:
        self._act(options["job_ids"], operator_actions.cancel, "cancelled")

    def _act(self, job_ids: Sequence[int], action: Any, done: str) -> None:
        wanted = sorted(set(job_ids))
        found = set(self._jobs().filter(pk__in=wanted).values_list("pk", flat=True))
        missing = [job_id for job_id in wanted if job_id not in found]
        report = action(self._jobs().filter(pk__in=found)) if found else None
        if report is not None:
            self.stdout.write(report.message(done))
        if missing:
            self.stderr.write("not found: " + ", ".join(f"#{job_id}" for job_id in missing))
        if missing or report is None or report.changed < len(found):
            raise CommandError(
                f"{len(wanted) - (report.changed if report else 0)} of {len(wanted)} jobs "
                f"not {done}",
                returncode=REFUSED,
            )

    def _enqueue(self, options: dict[str, Any]) -> None:
        task = registry.find(options["task"])
        if task is None:
            raise CommandError(
                f"unknown task {options['task']!r}: `manage.py jobs tasks` lists the registered "
                "ones",
                returncode=USAGE,
            )
        args = _json_argument(options["call_args"], "--args", list)
        kwargs = _json_argument(options["call_kwargs"], "--kwargs", dict)
        changes: dict[str, Any] = {}
        for option in ("queue", "priority", "unique_key"):
            if options[option] is not None:
                changes[option] = options[option]
        if options["run_after"] is not None:
            changes["run_after"] = _run_after(options["run_after"])
        try:
            job = (task.using(**changes) if changes else task).enqueue(*args, **kwargs)
        except (JobsError, ValueError, TypeError) as error:
            raise CommandError(str(error), returncode=USAGE) from None
        self.stdout.write(f"job #{job.pk} enqueued: {job.task} on queue {job.queue}, {job.state}")

    def _tasks(self, options: dict[str, Any]) -> None:
        rows = [
            {
                "name": task.name,
                "queue": task.queue,
                "priority": task.priority,
                "max_attempts": task.effective_max_attempts,
                "timeout": task.timeout,
                "schedule": task.schedule,
                "concurrency_limit": task.concurrency_limit,
                "remote": task.remote,
            }
            for task in sorted(registry.all(), key=lambda t: t.name)
        ]
        if options["json"]:
            self._json(rows)
            return
        table = [("TASK", "QUEUE", "PRIORITY", "ATTEMPTS", "TIMEOUT", "SCHEDULE", "RUNS")]
        for row in rows:
            table.append(
                (
                    str(row["name"]),
                    str(row["queue"]),
                    str(row["priority"]),
                    str(row["max_attempts"]),
                    "-" if row["timeout"] is None else f"{row['timeout']}s",
                    str(row["schedule"] or "-"),
                    "HTTP API workers" if row["remote"] else "here",
                )
            )
        self._table(table)
        if not rows:
            self.stderr.write(
                "no tasks are registered: define them with @job in an installed app's jobs.py"
            )

    # ------------------------------------------------------------------------- output

    def _json(self, value: Any) -> None:
        self.stdout.write(json.dumps(value, indent=2, default=str, ensure_ascii=False))

    def _table(self, rows: Sequence[Sequence[str]]) -> None:
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        for row in rows:
            cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=True)]
            self.stdout.write("  ".join(cells).rstrip())


def _attempt(job_id: int, number: int | None) -> Attempt | None:
    attempts = Attempt.objects.using(conf.database_alias()).filter(job_id=job_id)
    if number is not None:
        return attempts.filter(number=number).first()
    return attempts.order_by("-number").first()


def attempt_is_last(job_id: int, printed: tuple[int, str] | None) -> bool:
    """Whether what was printed is the whole log of the job's last attempt."""
    last = _attempt(job_id, None)
    if last is None:
        return True
    return printed is not None and printed[0] == last.number and printed[1] == mask_text(last.log)


def _new_text(before: str, now: str) -> str:
    """What ``now`` adds to ``before``: the stored log is a tail that drops its oldest lines as
    it grows, so ``now`` may no longer start where ``before`` did."""
    if now.startswith(before):
        return now[len(before) :]
    # Find where the end of what was printed lies in the new text.
    for size in (4096, 1024, 256, 64):
        tail = before[-size:]
        if len(tail) == size or len(tail) == len(before):
            at = now.rfind(tail)
            if at != -1 and tail:
                return now[at + len(tail) :]
    return now


def _summary(job: Job) -> dict[str, Any]:
    return {
        "id": job.pk,
        "state": job.state,
        "queue": job.queue,
        "task": job.task,
        "priority": job.priority,
        "attempt": job.attempt,
        "max_attempts": job.max_attempts,
        "created_at": job.created_at,
        "run_after": job.run_after,
        "started_at": job.started_at,
        "finished_at": job.finished_at,
        "error": mask_text(job.error),
    }


def _details(job: Job, attempts: Iterable[Attempt]) -> dict[str, Any]:
    progress = job.progress
    return {
        **_summary(job),
        "timeout": f"{job.timeout}s" if job.timeout else None,
        "worker_id": job.worker_id,
        "parent": job.parent_id,
        "unique_key": job.unique_key,
        "concurrency_key": job.concurrency_key,
        "cancel_requested": job.cancel_requested or None,
        "progress": _progress(progress) if progress is not None else None,
        "depends_on": list(job.dependencies.values_list("pk", flat=True)),
        "args": mask_value(job.args),
        "kwargs": mask_value(job.kwargs),
        "result": mask_value(job.result) if job.result is not None else None,
        "attempts": [
            {
                "number": attempt.number,
                "worker_id": attempt.worker_id,
                "outcome": attempt.outcome,
                "started_at": attempt.started_at,
                "finished_at": attempt.finished_at,
                "error": mask_text(attempt.error),
                "traceback": mask_text(attempt.traceback),
            }
            for attempt in attempts
        ],
    }


def _progress(shown: Shown) -> str:
    done = count(shown.done) + (f" of {count(shown.total)}" if shown.total else "")
    text = f"{shown.percent} ({done})" if shown.percent else done
    if shown.eta_seconds is not None:
        text += f", about {shown.eta_seconds:,.0f} s left"
    return text + (f": {mask_text(shown.message)}" if shown.message else "")


def _json_argument(text: str, option: str, kind: type) -> Any:
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as error:
        raise CommandError(f"{option} is not JSON: {error}", returncode=USAGE) from None
    if not isinstance(value, kind):
        wanted = "array" if kind is list else "object"
        raise CommandError(f"{option} must be a JSON {wanted}", returncode=USAGE)
    return value


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _run_after(text: str) -> datetime | timedelta:
    unit = _UNITS.get(text[-1:])
    if unit is not None and text[:-1].isascii() and text[:-1].isdigit():
        return timedelta(seconds=int(text[:-1]) * unit)
    try:
        when = parse_datetime(text)
    except ValueError:
        when = None
    if when is None or timezone.is_naive(when):
        raise CommandError(
            f"--run-after {text!r}: give an ISO 8601 time with its offset "
            "(2026-12-02T18:00:00+01:00) or a delay such as 90s, 10m, 2h or 1d",
            returncode=USAGE,
        )
    return when


def _when(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S") if value else "-"


def _one_line(text: str, most: int) -> str:
    line = " ".join(text.split())
    return line if len(line) <= most else line[: most - 1] + "…"


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines())
