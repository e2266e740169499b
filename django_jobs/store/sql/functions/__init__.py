"""The database functions of django-jobs, one file per version: ``django_jobs_claim_v5.sql``.

A file holds the comment lines that say what the version is and which migration made it, then the
statement that makes it (``CREATE FUNCTION``, or ``CREATE OR REPLACE FUNCTION``), exactly as that
migration runs it. The migrations load the files by name and version (:func:`function_sql`,
:func:`replace_function`) and never hold or copy a function's text, so each version's text is
kept once.

The newest version of each function is the one the database runs. Older versions are history:
a migration going backwards makes them again, and nothing else reads them. To change a function,
add the next version's file and a migration that makes it with :func:`replace_function`; restart
the workers after migrating.
"""

from __future__ import annotations

import dataclasses
import re
from importlib import resources

from django.db.migrations import RunSQL

_FILE = re.compile(r"^(?P<name>\w+)_v(?P<version>[1-9][0-9]*)\.sql$")


@dataclasses.dataclass(frozen=True)
class Function:
    """One version of one database function."""

    name: str
    version: int
    #: Its file's name (``django_jobs_claim_v5.sql``).
    file: str
    #: The whole file: the comment lines, then :attr:`statement`.
    source: str
    #: The statement that makes it, without the file's leading comment lines.
    statement: str


def _statement(source: str) -> str:
    lines = source.splitlines(keepends=True)
    header = 0
    while header < len(lines) and (lines[header].startswith("--") or not lines[header].strip()):
        header += 1
    return "".join(lines[header:])


def _read() -> dict[tuple[str, int], Function]:
    found = {}
    for entry in resources.files(__name__).iterdir():
        match = _FILE.match(entry.name)
        if match is None:
            continue
        source = entry.read_text(encoding="utf-8")
        name, version = match.group("name"), int(match.group("version"))
        found[name, version] = Function(name, version, entry.name, source, _statement(source))
    return dict(sorted(found.items()))


#: Every version of every function, by (name, version), in that order.
FUNCTIONS: dict[tuple[str, int], Function] = _read()


def function(name: str, version: int) -> Function:
    """Version ``version`` of the function ``name``."""
    try:
        return FUNCTIONS[name, version]
    except KeyError:
        raise KeyError(
            f"no file django_jobs/store/sql/functions/{name}_v{version}.sql"
            f" (there are: {', '.join(found.file for found in FUNCTIONS.values())})"
        ) from None


def function_sql(name: str, version: int) -> str:
    """The statement that makes version ``version`` of the function ``name``."""
    return function(name, version).statement


def newest() -> list[Function]:
    """The newest version of each function: the ones the database runs once migrated."""
    latest: dict[str, Function] = {}
    for found in FUNCTIONS.values():
        latest[found.name] = found
    return list(latest.values())


def replace_function(name: str, version: int, *, drop: str = "", reverse_drop: str = "") -> RunSQL:
    """A migration's operation that makes version ``version`` of ``name``, after running ``drop``
    (where the arguments or the result change, ``CREATE OR REPLACE`` cannot); backwards, it runs
    ``reverse_drop``, then makes the version before (none before version 1)."""
    forward = [statement for statement in (drop, function_sql(name, version)) if statement]
    backward = [reverse_drop] if reverse_drop else []
    if version > 1:
        backward.append(function_sql(name, version - 1))
    return RunSQL(tuple(forward), tuple(backward))
