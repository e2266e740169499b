"""API tokens: made once, stored as a hash, looked up per request through a short cache.

A token is ``djt_`` and 43 random URL-safe characters; ``manage.py createjobtoken`` prints it
once, and the table keeps its SHA-256 (a token is random and long, so a fast hash is enough:
nothing is gained by a slow one). A process serving the API remembers a looked-up token for
:data:`CACHE_SECONDS`, so that a claim does not read the token table; a revoked token is
refused within that long. While the table cannot be read, a grant read within
:data:`STALE_SECONDS` is used still (django_jobs/api/authentication.py decides when).
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import logging
import re
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, NamedTuple

import psycopg
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections, router
from django.utils import timezone

from django_jobs import conf
from django_jobs.exceptions import InvalidOption
from django_jobs.models.api_token import ALL_QUEUES, ApiToken
from django_jobs.registry import registry
from django_jobs.store import api_tokens, db

logger = logging.getLogger("django_jobs.api")

PREFIX = "djt_"
#: Seconds a process serving the API trusts what it read of a token.
CACHE_SECONDS = 10.0
#: Seconds a grant read earlier is still used while the token table cannot be read (a lock held
#: on it, an outage): a revocation cannot commit then either.
STALE_SECONDS = 60.0
#: Grants kept, and refusals kept, each (the least recently used go first).
CACHE_ENTRIES = 10_000
#: How often a token's last_used_at is written, at most.
USE_STAMP_SECONDS = 60.0
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
#: A token's lifetime as createjobtoken --expires takes it: 90d, 12h, 30m.
LIFETIME = re.compile(r"^([1-9][0-9]{0,5})([dhm])$")
_UNITS = {"d": "days", "h": "hours", "m": "minutes"}


@dataclasses.dataclass(frozen=True)
class Grant:
    """What a request's token allows: a snapshot of its row."""

    id: int
    name: str
    queues: tuple[str, ...]
    can_enqueue: bool
    #: The tasks it may enqueue and spawn; empty: every task.
    tasks: tuple[str, ...] = ()
    expires_at: datetime.datetime | None = None
    #: Whether the user it acts for was deactivated.
    user_inactive: bool = False

    @property
    def all_queues(self) -> bool:
        return ALL_QUEUES in self.queues

    def holds(self, queue: str) -> bool:
        """Whether it may claim from ``queue`` and see its jobs (as ``depends_on``)."""
        return self.all_queues or queue in self.queues

    def may_enqueue_to(self, queue: str) -> bool:
        """Whether it may enqueue (and spawn) into ``queue``: one of its queues; for a ``*``
        token, one of the queues the settings declare (:meth:`Registry.queues`)."""
        if self.all_queues:
            return queue in registry.queues()
        return queue in self.queues

    def may_enqueue_task(self, task: str) -> bool:
        return not self.tasks or task in self.tasks

    def refusal(self, now: datetime.datetime | None = None) -> str | None:
        """Why the API refuses it, though it is not revoked; None if it does not."""
        if self.user_inactive:
            return (
                f"token {self.name!r} belongs to a deactivated user; reactivate the user or "
                "make a new token (manage.py createjobtoken)"
            )
        if self.expires_at is not None and (now or timezone.now()) >= self.expires_at:
            return (
                f"token {self.name!r} expired at {self.expires_at.isoformat()}; make a new "
                "one (manage.py createjobtoken --expires)"
            )
        return None

    @property
    def worker_prefix(self) -> str:
        """What the ids of this token's workers start with in the worker registry."""
        return f"api:{self.name}:"


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def check_queues(queues: Sequence[str]) -> list[str]:
    """The queue list of a new token, checked: names of queues, or ``["*"]``."""
    names = [q.strip() for q in queues if q.strip()]
    if not names:
        raise InvalidOption("a token needs at least one queue (or * for every queue)")
    for name in names:
        if name != ALL_QUEUES and (len(name) > 100 or not name.isprintable()):
            raise InvalidOption(f"{name!r} is not a queue name")
    return sorted(set(names))


def check_tasks(tasks: Sequence[str]) -> list[str]:
    """The task list of a new token, checked: registered tasks (none: every task)."""
    names = sorted({t.strip() for t in tasks if t.strip()})
    known = set(registry.names())
    for name in names:
        if name not in known:
            raise InvalidOption(
                f"{name!r} is not a registered task; give task names as @job registers them "
                "(see the admin's task filter)"
            )
    return names


def lifetime(text: str) -> datetime.timedelta:
    """A token's lifetime written ``90d``, ``12h`` or ``30m``."""
    match = LIFETIME.match(text.strip())
    if match is None:
        raise InvalidOption(
            f"{text!r} is not a lifetime: write a number and d, h or m (90d, 12h, 30m)"
        )
    return datetime.timedelta(**{_UNITS[match.group(2)]: int(match.group(1))})


def create(
    name: str,
    queues: Sequence[str],
    *,
    can_enqueue: bool = False,
    created_by: str = "",
    tasks: Sequence[str] = (),
    expires_in: datetime.timedelta | None = None,
    user: Any = None,
) -> tuple[ApiToken, str]:
    """Store a new token; return its row and the token itself, which is not stored. ``user``
    (a user of ``AUTH_USER_MODEL``) is the one it acts for: it is refused while that user is
    inactive."""
    if not NAME.match(name):
        raise InvalidOption(
            f"{name!r} is not a token name: use letters, digits, '.', '_' and '-' (at most 100)"
        )
    checked = check_queues(queues)
    checked_tasks = check_tasks(tasks)
    if expires_in is not None and expires_in <= datetime.timedelta(0):
        raise InvalidOption("a token's lifetime must be positive (90d, 12h, 30m)")
    expires_at = None
    if expires_in is not None:
        expires_at = timezone.now() + expires_in
    secret = PREFIX + secrets.token_urlsafe(32)
    alias = conf.database_alias()
    with connections[alias].cursor() as cursor:
        row = api_tokens.insert_token(
            cursor,
            alias,
            name=name,
            token_hash=digest(secret),
            prefix=secret[: len(PREFIX) + 4],
            queues=checked,
            can_enqueue=can_enqueue,
            tasks=checked_tasks,
            expires_at=expires_at,
            created_by=created_by or (user.get_username() if user is not None else ""),
            user_id=None if user is None else user.pk,
        )
    return row, secret


class Fresh(NamedTuple):
    """A grant read within :data:`CACHE_SECONDS`; ``refresh`` when it is due to be read again
    (past half of that, or its use due to be stamped): the request goes on with it meanwhile."""

    grant: Grant
    refresh: bool


class Stale(NamedTuple):
    """A grant last read between :data:`CACHE_SECONDS` and :data:`STALE_SECONDS` ago: it may be
    used only while the token table cannot answer (a migration's lock, an outage)."""

    grant: Grant


class TokenCache:
    """Tokens looked up by hash, remembered for :data:`CACHE_SECONDS` (refusals too).

    Grants and refusals are kept apart, each the :data:`CACHE_ENTRIES` used last (least
    recently used first out): a flood of made-up tokens pushes out other made-up tokens, never
    the grants of the fleet's tokens."""

    def __init__(self, entries: int = CACHE_ENTRIES) -> None:
        self.entries = entries
        self._lock = threading.Lock()
        self._grants: OrderedDict[str, tuple[float, Grant]] = OrderedDict()
        self._refused: OrderedDict[str, float] = OrderedDict()
        self._stamped: dict[int, float] = {}

    #: What :meth:`peek` returns for a token it has not seen lately.
    MISS: object = object()

    def peek(self, token: str) -> Fresh | Stale | object | None:
        """What is known of ``token`` without reading the database: :class:`Fresh`,
        :class:`Stale`, None (refused lately), or :attr:`MISS`."""
        key = digest(token)
        now = time.monotonic()
        with self._lock:
            cached = self._grants.get(key)
            if cached is not None:
                self._grants.move_to_end(key)
                read_at, grant = cached
                age = now - read_at
                if age < CACHE_SECONDS:
                    stamp_due = now - self._stamped.get(grant.id, -1e18) >= USE_STAMP_SECONDS
                    return Fresh(grant, stamp_due or age >= CACHE_SECONDS / 2)
                if age < STALE_SECONDS:
                    return Stale(grant)
                return self.MISS
            refused_at = self._refused.get(key)
            if refused_at is not None and now - refused_at < CACHE_SECONDS:
                self._refused.move_to_end(key)
                return None
            return self.MISS

    def lookup(self, token: str) -> Grant | None:
        """The grant of ``token``, read from the database now, or None for an unknown or
        revoked one; its use is stamped when due. Call it where reading is allowed: a thread of
        the API's pool."""
        key = digest(token)
        grant = self._read(key)
        now = time.monotonic()
        with self._lock:
            if grant is None:
                self._grants.pop(key, None)
                self._remember(self._refused, key, now)
            else:
                self._refused.pop(key, None)
                self._remember(self._grants, key, (now, grant))
        if grant is not None:
            self._stamp(grant, now)
        return grant

    def _remember(self, entries: OrderedDict[str, Any], key: str, value: Any) -> None:
        entries[key] = value
        entries.move_to_end(key)
        while len(entries) > self.entries:
            entries.popitem(last=False)

    def size(self) -> tuple[int, int]:
        """How many grants and refusals are kept (for tests)."""
        with self._lock:
            return len(self._grants), len(self._refused)

    def _read(self, key: str) -> Grant | None:
        with connections[conf.database_alias()].cursor() as cursor:
            row = api_tokens.token_grant(cursor, key)
        if row is None:
            return None
        inactive = False
        if row.user_id is not None:
            users = router.db_for_read(ApiToken._meta.get_field("user").related_model)
            with connections[users or DEFAULT_DB_ALIAS].cursor() as cursor:
                inactive = not api_tokens.user_active(cursor, row.user_id)
        return Grant(
            row.id,
            row.name,
            tuple(row.queues or ()),
            bool(row.can_enqueue),
            tasks=tuple(row.tasks or ()),
            expires_at=row.expires_at,
            user_inactive=inactive,
        )

    def _stamp(self, grant: Grant, now: float) -> None:
        with self._lock:
            if now - self._stamped.get(grant.id, float("-inf")) < USE_STAMP_SECONDS:
                return
            self._stamped[grant.id] = now
        try:
            with connections[conf.database_alias()].cursor() as cursor:
                api_tokens.stamp_token_use(cursor, grant.id)
        except (DatabaseError, psycopg.Error) as exc:
            if not db.is_timeout(exc):
                raise
            # Only a last-use time: the request goes on, and the next one stamps it.
            logger.info("token %s: its use was not stamped (%s)", grant.name, exc)
            with self._lock:
                self._stamped.pop(grant.id, None)

    def forget(self) -> None:
        with self._lock:
            self._grants.clear()
            self._refused.clear()
            self._stamped.clear()


cache = TokenCache()


def revoke(ids: Sequence[int]) -> int:
    """Revoke the tokens ``ids`` (those not revoked yet); return how many were."""
    with connections[conf.database_alias()].cursor() as cursor:
        return api_tokens.revoke_tokens(cursor, ids)
