"""``manage.py createjobtoken``: a token for workers (or enqueuers) of the HTTP API."""

from __future__ import annotations

import getpass
from typing import Any

import psycopg
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import IntegrityError

from django_jobs.exceptions import InvalidOption
from django_jobs.management.errors import database_errors
from django_jobs.tokens import auth


class Command(BaseCommand):
    help = (
        "Create a token for the HTTP API (docs/http-api.md) and print it once: only its hash "
        "is stored. Workers send it as 'Authorization: Bearer <token>'. A token claims only "
        "from its queues; revoke it in the admin (Jobs > API tokens)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", help="Who uses it (a fleet, a team): letters, digits . _ -")
        parser.add_argument(
            "--queues",
            required=True,
            help="Comma-separated queues the token may claim from (and enqueue to), or '*' for "
            "every queue.",
        )
        parser.add_argument(
            "--can-enqueue",
            action="store_true",
            help="Also allow POST v1/enqueue (to the token's queues).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            with database_errors():
                row, secret = auth.create(
                    options["name"],
                    options["queues"].split(","),
                    can_enqueue=options["can_enqueue"],
                    created_by=_user(),
                )
        except InvalidOption as error:
            raise CommandError(str(error)) from None
        # psycopg's own too: with server-side binding, the store's statement runs on a psycopg
        # cursor, whose errors Django does not wrap.
        except (IntegrityError, psycopg.IntegrityError):
            raise CommandError(
                f"a token named {options['name']!r} exists already; revoke it in the admin or "
                "pick another name"
            ) from None
        self.stdout.write(secret)
        self.stderr.write(
            f"token {row.name!r}: queues {','.join(row.queues)}"
            f"{', may enqueue' if row.can_enqueue else ''}. It is shown only now: store it "
            "in a secret (a file for runjobworker --token-file)."
        )


def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:
        return ""
