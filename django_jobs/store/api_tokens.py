"""What the HTTP API reads and writes of its tokens: a request's grant by the token's hash, the
stamp of a token's use, and revoking.

The statements are in django_jobs/store/sql/api_tokens.sql. They run with the bounded waits of
every statement of the job system (see db.py), so that a migration or an operator holding a lock
on the token table makes the API answer 503 within ``JOBS_LOCK_TIMEOUT_MS`` rather than hold
every request until the lock is released.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from django_jobs.cursor import Cursor
from django_jobs.store import db
from django_jobs.store.sql import query


class TokenGrant(NamedTuple):
    """A token that is not revoked, as a request's grant reads it."""

    id: int
    name: str
    queues: list[str]
    can_enqueue: bool


def token_grant(cursor: Cursor, token_hash: str) -> TokenGrant | None:
    """The token whose hash is ``token_hash``, or None if there is none or it was revoked."""
    result = db.execute(cursor, query("token_grant"), {"token_hash": token_hash})
    return db.fetch_one_as(result, TokenGrant)


def stamp_token_use(cursor: Cursor, token_id: int) -> None:
    """Record that the token ``token_id`` was used just now."""
    db.execute(cursor, query("stamp_token_use"), {"id": token_id})


def revoke_tokens(cursor: Cursor, ids: Sequence[int]) -> int:
    """Revoke the tokens ``ids`` that are not revoked yet; return how many were."""
    return len(db.execute(cursor, query("revoke_tokens"), {"ids": list(ids)}).fetchall())
