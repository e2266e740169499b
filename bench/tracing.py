"""Counting what a connection says to PostgreSQL, from libpq's own protocol trace.

A *statement* is one Execute message (extended protocol) or one Query message (simple
protocol); a *round trip* is one ReadyForQuery from the server, the point where the client
waits for the server before it can go on. The trace shows everything psycopg does, including
the extra round trip with which it prepares a statement it has run five times.
"""

from __future__ import annotations

import collections
import dataclasses
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from psycopg.pq import Trace

_MESSAGE = re.compile(r"^(F|B)\t\d+\t(\w+)", re.MULTILINE)
_NAMES = re.compile(r'\s*"([^"]*)"\s*"([^"]*)"')

_open_traces: list[Any] = []


def start_trace(conn: Any, path: str | Path) -> None:
    """Trace every protocol message of ``conn`` to ``path`` (until the process exits)."""
    out = open(path, "w")  # noqa: SIM115 - libpq writes to it until the connection closes
    _open_traces.append(out)
    conn.pgconn.trace(out.fileno())
    conn.pgconn.set_trace_flags(Trace.SUPPRESS_TIMESTAMPS | Trace.REGRESS_MODE)


@dataclasses.dataclass
class TraceCounts:
    statements: int = 0
    round_trips: int = 0
    by_kind: dict[str, int] = dataclasses.field(default_factory=dict)


def count(path: str | Path, kinds: Sequence[tuple[str, str | tuple[str, ...]]]) -> TraceCounts:
    """Count statements and round trips in a trace; ``kinds`` names statements by a piece of
    their SQL, or by several pieces that must all be there (the first match wins; the rest are
    ``other``)."""
    text = Path(path).read_text(errors="replace")
    starts = list(_MESSAGE.finditer(text))
    prepared: dict[str, str] = {}
    unnamed = ""
    current = ""
    counts = TraceCounts()
    by_kind: collections.Counter[str] = collections.Counter()

    def kind_of(query: str) -> str:
        return next(
            (
                name
                for name, pieces in kinds
                if all(p in query for p in ((pieces,) if isinstance(pieces, str) else pieces))
            ),
            "other",
        )

    for i, match in enumerate(starts):
        end = starts[i + 1].start() if i + 1 < len(starts) else len(text)
        body = text[match.end() : end]
        side, message = match.group(1), match.group(2)
        if side == "B":
            if message == "ReadyForQuery":
                counts.round_trips += 1
            continue
        if message == "Parse":
            names = _NAMES.match(body)
            name = names.group(1) if names else ""
            if name:
                prepared[name] = body
            else:
                unnamed = body
        elif message == "Bind":
            names = _NAMES.match(body)
            statement = names.group(2) if names else ""
            current = prepared.get(statement, "") if statement else unnamed
        elif message == "Execute":
            counts.statements += 1
            by_kind[kind_of(current)] += 1
        elif message == "Query":
            counts.statements += 1
            by_kind[kind_of(body)] += 1
    counts.by_kind = dict(by_kind)
    return counts
