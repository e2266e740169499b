"""What the HTTP API reads and writes of its tokens: a new token, a request's grant by the
token's hash, the stamp of a token's use, and revoking.

The statements are in django_jobs/store/sql/api_tokens.sql. They run with the bounded waits of
every statement of the job system (see db.py), so that a migration or an operator holding a lock
on the token table makes the API answer 503 within ``JOBS_LOCK_TIMEOUT_MS`` rather than hold
every request until the lock is released.
"""

from __future__ import annotations

import datetime
import functools
import json
from collections.abc import Sequence
from typing import Any, NamedTuple

from django_jobs.cursor import Cursor
from django_jobs.models.api_token import ApiToken
from django_jobs.store import db
from django_jobs.store.sql import query


def insert_token(
    cursor: Cursor,
    alias: str,
    *,
    name: str,
    token_hash: str,
    prefix: str,
    queues: Sequence[str],
    can_enqueue: bool,
    tasks: Sequence[str] = (),
    expires_at: datetime.datetime | None = None,
    created_by: str,
    user_id: Any = None,
) -> ApiToken:
    """Store a new token; return its row, as read from the database ``alias`` names."""
    params = {
        "name": name,
        "token_hash": token_hash,
        "prefix": prefix,
        "queues": json.dumps(list(queues)),
        "can_enqueue": can_enqueue,
        "tasks": json.dumps(list(tasks)),
        "expires_at": expires_at,
        "created_by": created_by,
        "user_id": user_id,
    }
    result = db.execute(cursor, query("insert_token"), params)
    # from_db takes the values in the order of the model's fields: checked, not assumed.
    names = [column[0] for column in result.description]
    fields = [field.attname for field in ApiToken._meta.concrete_fields]
    if names != fields:
        raise db.ColumnMismatch(
            f"insert_token returns ({', '.join(names)}), not ApiToken's ({', '.join(fields)})"
        )
    return ApiToken.from_db(alias, names, result.fetchone())


class TokenGrant(NamedTuple):
    """A token that is not revoked, as a request's grant reads it."""

    id: int
    name: str
    queues: list[str]
    can_enqueue: bool
    #: The tasks it may enqueue and spawn; empty: any.
    tasks: list[str]
    expires_at: datetime.datetime | None
    user_id: Any


def token_grant(cursor: Cursor, token_hash: str) -> TokenGrant | None:
    """The token whose hash is ``token_hash``, or None if there is none or it was revoked (an
    expired one is read, with its expiry)."""
    result = db.execute(cursor, query("token_grant"), {"token_hash": token_hash})
    return db.fetch_one_as(result, TokenGrant)


class _Active(NamedTuple):
    active: bool


def user_active(cursor: Cursor, user_id: Any) -> bool:
    """Whether the user ``user_id`` of ``AUTH_USER_MODEL`` exists and is active."""
    result = db.execute(cursor, user_active_statement(), {"user_id": user_id})
    row = db.fetch_one_as(result, _Active)
    return row is not None and bool(row.active)


@functools.cache
def user_active_statement() -> str:
    """token_user_active, for the table of ``AUTH_USER_MODEL`` (a swappable model: its table and
    columns are known only once the project's settings are)."""
    model = ApiToken._meta.get_field("user").related_model
    assert model is not None and not isinstance(model, str)
    opts = model._meta
    columns = {field.name: str(field.column) for field in opts.concrete_fields}
    active = _quoted(columns["is_active"]) if "is_active" in columns else "true"
    assert opts.pk is not None
    return query("token_user_active").format(
        table=_quoted(opts.db_table), pk=_quoted(str(opts.pk.column)), active=active
    )


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def stamp_token_use(cursor: Cursor, token_id: int) -> None:
    """Record that the token ``token_id`` was used just now."""
    db.execute(cursor, query("stamp_token_use"), {"id": token_id})


def revoke_tokens(cursor: Cursor, ids: Sequence[int]) -> int:
    """Revoke the tokens ``ids`` that are not revoked yet; return how many were."""
    return len(db.execute(cursor, query("revoke_tokens"), {"ids": list(ids)}).fetchall())
