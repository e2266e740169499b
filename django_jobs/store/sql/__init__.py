"""The job system's SQL, read from the ``.sql`` files of this folder: ``query(name)`` is the
statement named ``name``, in its final text.

Each file holds named statements, one after the other::

    -- name: release
    -- transition: release
    -- What it does, and the indexes it uses.
    WITH job AS (
        UPDATE django_jobs_job SET state = 'pending', ...

A statement runs from its ``-- name:`` line to the next one. The comment lines right under the
name are its description and are left out of its text (a ``%`` in them would be taken for a
parameter); comments inside the statement stay. Parameters are psycopg's, ``%(name)s``.

A statement that writes ``Job.state`` says which transition of django_jobs/states.py it makes,
in a ``-- transition:`` line: the files are read once, when this module is imported, and each
such statement is declared with :meth:`~django_jobs.states.Transition.statement`.
tests/unit/test_states.py checks that every statement that writes ``state`` says so, that its
guards are the ones its transition renders, and that it writes only the transition's states.

The PL/pgSQL functions are in ``functions/``, one file per version (see its ``__init__``). The
newest version of each is a named statement too, named for the function (``django_jobs_claim``),
so that its transition is declared and checked like any other statement's.
"""

from __future__ import annotations

import dataclasses
import re
from importlib import resources

from django_jobs.states import TRANSITIONS, Transition
from django_jobs.store.sql import functions

_NAME = re.compile(r"^-- name: (\S+)[ \t]*$", re.MULTILINE)
_TRANSITION = "-- transition:"


@dataclasses.dataclass(frozen=True)
class Query:
    name: str
    #: The file it is in (``claim.sql``).
    file: str
    #: The statement, without its description.
    text: str
    #: The transition it makes, if it writes ``Job.state``.
    transition: Transition | None
    #: Its description: the comment lines under its name, without their ``--``.
    description: str


def parse(source: str, file: str) -> list[Query]:
    """The named statements of one file's ``source``."""
    by_name = {transition.name: transition for transition in TRANSITIONS}
    marks = list(_NAME.finditer(source))
    found = []
    for mark, following in zip(marks, [*marks[1:], None], strict=True):
        block = source[mark.end() : following.start() if following else len(source)]
        lines = block.strip("\n").splitlines()
        header = 0
        while header < len(lines) and lines[header].startswith("--"):
            header += 1
        transition = None
        description = []
        for line in lines[:header]:
            if line.startswith(_TRANSITION):
                name = line[len(_TRANSITION) :].strip()
                if name not in by_name:
                    raise ValueError(f"{file}: {mark.group(1)} names no transition {name!r}")
                transition = by_name[name]
            else:
                description.append(line[2:].strip())
        text = "\n".join(line.rstrip() for line in lines[header:]).strip()
        if not text:
            raise ValueError(f"{file}: {mark.group(1)} has no statement")
        found.append(Query(mark.group(1), file, text, transition, "\n".join(description)))
    return found


def _sources() -> list[tuple[str, str]]:
    """Each file's name and text: the ``.sql`` files of this folder, then the newest version of
    each function, as a file of one statement named for the function."""
    folder = resources.files(__name__)
    files = [
        (entry.name, entry.read_text(encoding="utf-8"))
        for entry in sorted(folder.iterdir(), key=lambda entry: entry.name)
        if entry.name.endswith(".sql")
    ]
    return files + [
        (f"functions/{newest.file}", f"-- name: {newest.name}\n{newest.source}")
        for newest in functions.newest()
    ]


def _load() -> dict[str, Query]:
    queries: dict[str, Query] = {}
    for file, source in _sources():
        for found in parse(source, file):
            if found.name in queries:
                raise ValueError(
                    f"{found.name} is named twice: {queries[found.name].file}, {found.file}"
                )
            queries[found.name] = found
            if found.transition is not None:
                found.transition.statement(found.text)
    return queries


#: Every named statement, by name.
QUERIES: dict[str, Query] = _load()


def query(name: str) -> str:
    """The text of the statement named ``name``."""
    try:
        return QUERIES[name].text
    except KeyError:
        raise KeyError(
            f"no SQL statement is named {name!r} in django_jobs/store/sql/*.sql"
            f" (there are: {', '.join(sorted(QUERIES))})"
        ) from None
