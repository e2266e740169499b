"""The cursor that statement functions take: Django's (``connection.cursor()``) or psycopg's.

The worker runs its statements on a psycopg connection of its own, and the admin, the reaper
and the commands on Django's; the statement functions accept either, through this protocol.
"""

from __future__ import annotations

from typing import Any, Protocol


class Cursor(Protocol):
    """What django-jobs uses of a DB-API cursor."""

    @property
    def description(self) -> Any: ...

    @property
    def rowcount(self) -> int: ...

    def execute(self, query: Any, params: Any = None, /) -> object: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...
