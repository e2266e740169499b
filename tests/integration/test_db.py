"""How the job system runs its statements: bounded waits, durable commits and one transaction
each, whatever the connection's options say."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import psycopg
import pytest
from django.db import connection

from django_jobs import conf
from django_jobs.store import db
from tests.conftest import connect

pytestmark = pytest.mark.django_db(transaction=True)

BINDINGS = pytest.mark.parametrize(
    "cursor_class",
    [psycopg.ClientCursor, psycopg.Cursor],
    ids=["client-side binding", "server-side binding"],
)

_SETTINGS = """
SELECT extract(epoch FROM current_setting('lock_timeout')::interval) * 1000,
       extract(epoch FROM current_setting('statement_timeout')::interval) * 1000,
       current_setting('synchronous_commit'),
       current_setting('jit')
"""


def _careless_connection(cursor_class: type, synchronous_commit: str = "off") -> psycopg.Connection:
    """A connection whose session settings would make a claim wait forever and commit lazily."""
    return connect(
        cursor_factory=cursor_class,
        options=f"-c synchronous_commit={synchronous_commit} -c lock_timeout=0"
        " -c statement_timeout=0",
    )


@BINDINGS
def test_a_statement_runs_with_bounded_waits_and_a_durable_commit(cursor_class: type) -> None:
    with _careless_connection(cursor_class) as conn:
        row = db.execute(conn.cursor(), _SETTINGS).fetchone()
    assert row == (conf.lock_timeout_ms(), conf.statement_timeout_ms(), "on", "off")


@BINDINGS
def test_statements_sent_together_are_one_transaction_with_bounded_waits(cursor_class) -> None:
    with _careless_connection(cursor_class) as conn:
        first, second, settings = db.execute_together(
            conn.cursor(),
            [
                ("SELECT pg_current_xact_id()::text", None),
                ("SELECT pg_current_xact_id()::text, %s::int", [7]),
                (_SETTINGS, None),
            ],
        )
    assert first[0][0] == second[0][0] and second[0][1] == 7
    assert settings == [(conf.lock_timeout_ms(), conf.statement_timeout_ms(), "on", "off")]


class Pair(NamedTuple):
    name: str
    size: int


@dataclasses.dataclass(frozen=True)
class PairRecord:
    size: int
    name: str


@BINDINGS
def test_rows_are_read_by_column_name_into_named_tuples_and_dataclasses(cursor_class) -> None:
    statement = "SELECT * FROM (VALUES (2, 'b'), (1, 'a')) AS t(size, name) ORDER BY size"
    with connect(cursor_factory=cursor_class) as conn:
        pairs = db.fetch_all_as(db.execute(conn.cursor(), statement), Pair)
        record = db.fetch_one_as(db.execute(conn.cursor(), statement), PairRecord)
        none = db.fetch_one_as(db.execute(conn.cursor(), statement + " LIMIT 0"), Pair)
    assert pairs == [Pair("a", 1), Pair("b", 2)]
    assert record == PairRecord(1, "a")
    assert none is None


def test_a_column_that_is_not_a_field_of_the_row_is_refused_with_both_lists() -> None:
    with connection.cursor() as cursor:
        result = db.execute(cursor, "SELECT 'a' AS name, 1 AS length")
        with pytest.raises(db.ColumnMismatch, match=r"\(name, length\).*Pair \(name, size\)"):
            db.fetch_one_as(result, Pair)


def test_columns_read_by_position_must_be_the_fields_in_order() -> None:
    with connection.cursor() as cursor:
        db.check_columns(db.execute(cursor, "SELECT 'a' AS name, 1 AS size"), Pair)
        result = db.execute(cursor, "SELECT 1 AS size, 'a' AS name")
        with pytest.raises(db.ColumnMismatch, match=r"\(size, name\).*order.*Pair \(name, size\)"):
            db.check_columns(result, Pair)


def test_a_stronger_synchronous_commit_of_the_operator_is_kept() -> None:
    with _careless_connection(psycopg.ClientCursor, "remote_apply") as conn:
        row = db.execute(conn.cursor(), _SETTINGS).fetchone()
    assert row[2] == "remote_apply"


@BINDINGS
def test_inside_a_callers_transaction_the_waits_are_bounded_and_the_callers_settings_kept(
    cursor_class: type,
) -> None:
    with _careless_connection(cursor_class) as conn, conn.transaction():
        conn.execute("SET LOCAL jit = on")
        row = db.execute(conn.cursor(), _SETTINGS).fetchone()
        assert row[:2] == (conf.lock_timeout_ms(), conf.statement_timeout_ms())
        assert row[3] == "off"
        after = conn.execute(_SETTINGS).fetchone()
        assert after == (0, 0, "off", "on")  # the caller's own, for the rest of its transaction


def test_the_system_checks_pass_on_postgresql_with_psycopg_3() -> None:
    from django_jobs.checks import check_jobs_database

    assert check_jobs_database() == []


def test_a_jobs_database_that_is_not_defined_fails_the_system_checks(settings) -> None:
    from django_jobs.checks import check_jobs_database

    settings.JOBS_DATABASE = "jobs"
    assert [message.id for message in check_jobs_database()] == ["django_jobs.E001"]
    settings.DATABASES = {**settings.DATABASES, "jobs": {"ENGINE": "django.db.backends.sqlite3"}}
    assert [message.id for message in check_jobs_database()] == ["django_jobs.E002"]
