"""What went wrong with a database, in one line that says what to do.

The commands, the worker, the scheduler, ``enqueue()`` and the admin's dashboard meet the same
two mistakes of a new deployment: the job tables are not there yet (``manage.py migrate`` was
not run, or not since an upgrade), and the database is down or refuses the connection. Both come
from the driver as errors whose text names neither the fix nor the Django alias. Here they are
told apart and explained: the tables that are missing with the django_jobs migrations not yet
applied, when those can be read; the server with the alias and the host it was reached at.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import psycopg
from django.db import DatabaseError, InterfaceError, OperationalError, connections

from django_jobs import conf
from django_jobs.exceptions import DatabaseUnreachable, JobTablesMissing
from django_jobs.store.db import LOCK_NOT_AVAILABLE, QUERY_CANCELED

APP_LABEL = "django_jobs"

# SQLSTATEs of a schema older than the code: a table, a column or a function of the job system
# that is not there (42P01 undefined_table, 42703 undefined_column, 42883 undefined_function).
_SCHEMA_MISSING = {"42P01", "42703", "42883"}
# A bounded wait that ran out: the statement timeout, the lock timeout.
_WAITS = {QUERY_CANCELED, LOCK_NOT_AVAILABLE}


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and the errors behind it (Django wraps the driver's)."""
    seen: set[int] = set()
    error: BaseException | None = exc
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


def schema_missing(exc: BaseException) -> bool:
    """Whether ``exc`` says that a table, column or function of the job system is missing."""
    return any(getattr(error, "sqlstate", None) in _SCHEMA_MISSING for error in _causes(exc))


def unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` says that the database could not be reached or dropped the connection
    (refused, timed out, shutting down), rather than refusing one statement."""
    for error in _causes(exc):
        if isinstance(error, psycopg.OperationalError | psycopg.InterfaceError):
            sqlstate = getattr(error, "sqlstate", None) or ""
            # No SQLSTATE: the connection was never made, or broke. 08: connection exceptions;
            # 57P: the server is shutting down or starting up.
            return not sqlstate or sqlstate.startswith(("08", "57P"))
    return isinstance(exc, OperationalError | InterfaceError) and not any(
        getattr(error, "sqlstate", None) for error in _causes(exc)
    )


def where(alias: str) -> str:
    """The alias and what it points at, with no credentials: ``'default' at 127.0.0.1:5432/app``."""
    try:
        settings = connections[alias].settings_dict
    except Exception:  # an alias that is not in DATABASES
        return repr(alias)
    host = settings.get("HOST") or "the local socket"
    port = settings.get("PORT")
    target = f"{host}:{port}" if port else str(host)
    name = settings.get("NAME")
    return f"{alias!r} at {target}/{name}" if name else f"{alias!r} at {target}"


def unapplied_migrations(alias: str) -> list[str]:
    """The django_jobs migrations not applied to ``alias``, in order. Raises the driver's error
    when the database cannot be read."""
    from django.db.migrations.loader import MigrationLoader

    loader = MigrationLoader(connections[alias], ignore_no_migrations=True)
    applied = set(loader.applied_migrations)
    plan = []
    for leaf in loader.graph.leaf_nodes(APP_LABEL):
        plan += [node for node in loader.graph.forwards_plan(leaf) if node not in plan]
    return [name for app, name in plan if app == APP_LABEL and (app, name) not in applied]


def _unapplied_note(alias: str) -> str:
    """``: 15 django_jobs migration(s) not applied (0001_initial, …, 0015_api_tokens)``, or
    nothing when that cannot be told (the connection is in a failed transaction, say)."""
    try:
        return _listed(unapplied_migrations(alias))
    except Exception:
        return ""


def _listed(names: list[str]) -> str:
    if not names:
        return ""
    shown = names if len(names) <= 3 else [names[0], "…", names[-1]]
    return f": {len(names)} django_jobs migration(s) not applied ({', '.join(shown)})"


def missing_tables_message(alias: str, detail: str = "", unapplied: list[str] | None = None) -> str:
    """The line for a database without (all of) the job tables: which migrations are not
    applied (read from the database unless given), else what the driver said."""
    note = _unapplied_note(alias) if unapplied is None else _listed(unapplied)
    found = f" ({detail})" if detail and not note else ""
    database = "" if alias == "default" else f" --database {alias}"
    return (
        f"the job tables are missing or out of date in database {where(alias)}{note}{found}; "
        f"run `python manage.py migrate{database}`"
    )


def unreachable_message(alias: str, exc: BaseException, what: str = "database") -> str:
    """The line for a database that is down or refuses the connection."""
    return f"the {what} {where(alias)} is unreachable: {first_line(exc)}"


def explain(exc: BaseException, alias: str, what: str = "database") -> str | None:
    """One line that says what is wrong and what to do, for the two mistakes above; ``None``
    for any other error."""
    if schema_missing(exc):
        return missing_tables_message(alias, first_line(exc))
    if unreachable(exc):
        return unreachable_message(alias, exc, what)
    return None


def first_line(exc: BaseException) -> str:
    """The first line of the driver's message ("connection failed: ... Connection refused")."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


@contextlib.contextmanager
def translated(
    alias: str | None = None, what: str = "database", *, waits: bool = False
) -> Iterator[None]:
    """Raise the two mistakes above as :class:`~django_jobs.exceptions.JobTablesMissing` (a
    ``ProgrammingError``) and :class:`~django_jobs.exceptions.DatabaseUnreachable` (an
    ``OperationalError``), with the line that says what to do; anything else as it came. With
    ``waits``, a statement or lock wait that ran out is a ``DatabaseUnreachable`` too (reads
    that have somewhere else to go, or nothing to retry)."""
    try:
        yield
    except (JobTablesMissing, DatabaseUnreachable):
        raise
    except (DatabaseError, psycopg.Error) as exc:  # psycopg's: a server-side binding cursor's
        alias = alias or conf.database_alias()
        if schema_missing(exc):
            raise JobTablesMissing(missing_tables_message(alias, first_line(exc))) from exc
        if unreachable(exc):
            raise DatabaseUnreachable(unreachable_message(alias, exc, what)) from exc
        if waits and any(getattr(e, "sqlstate", None) in _WAITS for e in _causes(exc)):
            raise DatabaseUnreachable(
                f"the {what} {where(alias)} did not answer in time: {first_line(exc)} "
                "(JOBS_STATEMENT_TIMEOUT_MS, JOBS_LOCK_TIMEOUT_MS)"
            ) from exc
        raise


def describe(exc: BaseException, alias: str) -> str:
    """:func:`explain`, or the error's class and first line."""
    return explain(exc, alias) or f"{type(exc).__name__}: {first_line(exc)}"
