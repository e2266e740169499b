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
            help="Also allow POST v1/enqueue, and spawning children of its jobs (into the "
            "token's queues; for '*', the queues the settings declare).",
        )
        parser.add_argument(
            "--tasks",
            default="",
            help="Comma-separated tasks the token may enqueue and spawn (default: any task of "
            "its queues).",
        )
        parser.add_argument(
            "--expires",
            default=None,
            help="Lifetime, after which the API refuses the token: 90d, 12h or 30m (default: "
            "it never expires).",
        )
        parser.add_argument(
            "--user",
            default=None,
            help="Username of the user the token acts for (recorded as its creator); the API "
            "refuses the token while that user is inactive.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            lifetime = None if options["expires"] is None else auth.lifetime(options["expires"])
            with database_errors():
                user = None if options["user"] is None else _django_user(options["user"])
                row, secret = auth.create(
                    options["name"],
                    options["queues"].split(","),
                    can_enqueue=options["can_enqueue"],
                    tasks=options["tasks"].split(","),
                    expires_in=lifetime,
                    user=user,
                    created_by="" if user is not None else _user(),
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
        scope = [f"queues {','.join(row.queues)}"]
        if row.can_enqueue:
            scope.append("may enqueue and spawn")
        if row.tasks:
            scope.append(f"tasks {','.join(row.tasks)}")
        if row.expires_at is not None:
            scope.append(f"expires {row.expires_at.isoformat(timespec='seconds')}")
        if row.user_id is not None:
            scope.append(f"user {row.created_by}")
        self.stderr.write(
            f"token {row.name!r}: {'; '.join(scope)}. It is shown only now: store it "
            "in a secret (a file for runjobworker --token-file)."
        )


def _django_user(username: str) -> Any:
    from django.contrib.auth import get_user_model

    model = get_user_model()
    try:
        user = model._default_manager.get_by_natural_key(username)
    except model.DoesNotExist:
        raise CommandError(
            f"no user named {username!r}; create it first (createsuperuser)"
        ) from None
    if not user.is_active:
        raise CommandError(f"user {username!r} is inactive; its tokens would be refused")
    return user


def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:
        return ""
