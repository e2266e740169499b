"""``manage.py jobqueue``: pause, resume, limit and list queues."""

from __future__ import annotations

import getpass
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_jobs import queues
from django_jobs.exceptions import InvalidOption
from django_jobs.management.arguments import add_subcommand
from django_jobs.management.errors import database_errors
from django_jobs.models.queue_control import Queue


class Command(BaseCommand):
    help = (
        "Pause, resume, limit or list job queues. A paused queue is not claimed from (running "
        "jobs finish; enqueueing still works); a limited queue runs at most N jobs at once "
        "across all workers. Changes take effect at the next claim of every worker."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
        pause = add_subcommand(actions, parser, "pause", help="Stop claims from a queue.")
        pause.add_argument("name", help="The queue.")
        pause.add_argument("--reason", default="", help="Why; shown in the admin and Grafana.")
        resume = add_subcommand(actions, parser, "resume", help="Claim from a paused queue again.")
        resume.add_argument("name", help="The queue.")
        limit = add_subcommand(
            actions,
            parser,
            "limit",
            help="Cap a queue's running jobs across all workers, or lift the cap.",
        )
        limit.add_argument("name", help="The queue.")
        limit.add_argument(
            "limit",
            help="A whole number from 1; 'none' lifts the cap; 'settings' goes back to "
            "JOBS_QUEUE_LIMITS.",
        )
        add_subcommand(
            actions, parser, "list", help="Every known queue: paused, limit, pending, running."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        action = options["action"]
        with database_errors():
            self._act(action, options)

    def _act(self, action: str, options: dict[str, Any]) -> None:
        try:
            if action == "list":
                self._list()
                return
            name = options["name"]
            if action == "pause":
                queues.pause(name, by=f"jobqueue ({_user()})", reason=options["reason"])
                self.stdout.write(f"queue {name} paused")
            elif action == "resume":
                queues.resume(name)
                self.stdout.write(f"queue {name} resumed")
            else:
                self._limit(name, options["limit"])
        except InvalidOption as error:
            raise CommandError(str(error)) from None

    def _limit(self, name: str, value: str) -> None:
        if value == "settings":
            queues.set_limit(name, None, source=Queue.LimitSource.SETTINGS)
        elif value == "none":
            queues.set_limit(name, None)
        else:
            try:
                limit = int(value)
            except ValueError:
                raise CommandError(
                    f"limit must be a whole number from 1, 'none' or 'settings', not {value!r}"
                ) from None
            queues.set_limit(name, limit)
        state = next(q for q in queues.states() if q.name == name)
        shown = state.concurrency_limit if state.concurrency_limit is not None else "none"
        self.stdout.write(f"queue {name} limit: {shown}")

    def _list(self) -> None:
        rows = [("QUEUE", "STATE", "LIMIT", "PENDING", "RUNNING", "PAUSED BY / REASON")]
        for q in queues.states():
            limit = "-" if q.concurrency_limit is None else str(q.concurrency_limit)
            if q.limit_source == Queue.LimitSource.SETTINGS:
                limit += " (settings)"
            paused = ""
            if q.paused:
                when = q.paused_at.strftime("%Y-%m-%d %H:%M:%S %Z") if q.paused_at else ""
                reason = f": {q.pause_reason}" if q.pause_reason else ""
                paused = f"{q.paused_by} at {when}{reason}"
            state = "paused" if q.paused else "open"
            rows.append((q.name, state, limit, str(q.pending), str(q.running), paused))
        widths = [max(len(row[i]) for row in rows) for i in range(5)]
        for row in rows:
            cells = [cell.ljust(width) for cell, width in zip(row[:5], widths, strict=True)]
            self.stdout.write("  ".join([*cells, row[5]]).rstrip())


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "?"
