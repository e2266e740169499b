"""How a database error is told in one line: which errors are missing tables, which a database
out of reach, and how the alias is named. No database: the driver's errors are built here."""

from __future__ import annotations

import psycopg
import pytest
from django.db import connections
from django.db.utils import OperationalError, ProgrammingError

from django_jobs.exceptions import DatabaseUnreachable, JobTablesMissing
from django_jobs.store import diagnosis


def wrapped(django_class: type[Exception], driver_error: Exception) -> Exception:
    """A Django error with the driver's behind it, as Django raises them."""
    try:
        try:
            raise driver_error
        except Exception as exc:
            raise django_class(str(exc)) from exc
    except Exception as error:
        return error


def test_a_missing_table_column_or_function_is_a_schema_older_than_the_code() -> None:
    for driver_error in (
        psycopg.errors.UndefinedTable('relation "django_jobs_job" does not exist'),
        psycopg.errors.UndefinedColumn('column "lease" does not exist'),
        psycopg.errors.UndefinedFunction("function django_jobs_claim_v4 does not exist"),
    ):
        error = wrapped(ProgrammingError, driver_error)
        assert diagnosis.schema_missing(error) and not diagnosis.unreachable(error)
    syntax = wrapped(ProgrammingError, psycopg.errors.SyntaxError("syntax error"))
    assert not diagnosis.schema_missing(syntax)


def test_a_refused_or_broken_connection_is_out_of_reach_and_a_timeout_is_not() -> None:
    refused = wrapped(OperationalError, psycopg.OperationalError("connection failed: refused"))
    shutdown = wrapped(OperationalError, psycopg.errors.AdminShutdown("terminating connection"))
    assert diagnosis.unreachable(refused) and diagnosis.unreachable(shutdown)
    timeout = wrapped(OperationalError, psycopg.errors.QueryCanceled("statement timeout"))
    assert not diagnosis.unreachable(timeout) and diagnosis.explain(timeout, "default") is None


def test_the_alias_is_named_with_its_host_and_database_never_its_password() -> None:
    settings = connections["default"].settings_dict
    line = diagnosis.where("default")
    assert line.startswith("'default' at ") and line.endswith(f"/{settings['NAME']}")
    assert not settings.get("PASSWORD") or settings["PASSWORD"] not in line
    assert diagnosis.where("no-such-alias") == "'no-such-alias'"


def test_translated_errors_keep_the_classes_callers_catch() -> None:
    error = wrapped(OperationalError, psycopg.OperationalError("connection failed: refused"))
    with (
        pytest.raises(DatabaseUnreachable) as raised,
        diagnosis.translated("default", "read database"),
    ):
        raise error
    assert isinstance(raised.value, OperationalError) and raised.value.__cause__ is error
    assert str(raised.value).startswith("the read database 'default' at ")
    assert str(raised.value).endswith("is unreachable: connection failed: refused")
    timeout = wrapped(OperationalError, psycopg.errors.QueryCanceled("statement timeout"))
    with pytest.raises(OperationalError) as raised, diagnosis.translated("default"):
        raise timeout
    assert raised.value is timeout  # not a reason to say the database is away
    slow = pytest.raises(DatabaseUnreachable, match="did not answer in time: statement timeout")
    with slow, diagnosis.translated("default", waits=True):
        raise timeout
    assert issubclass(JobTablesMissing, ProgrammingError)
