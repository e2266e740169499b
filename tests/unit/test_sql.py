"""The SQL of django_jobs/store/sql/: the loader, and the statements that repeat a piece of another
(final text has no fragments to share), checked to say the same."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from django_jobs.store import db, sql
from django_jobs.worker import wakeup

ROOT = Path(__file__).resolve().parents[2]


def _words(text: str) -> str:
    return " ".join(text.split())


def _between(text: str, start: str, end: str) -> str:
    found = re.search(re.escape(start) + "(.*?)" + re.escape(end), _words(text))
    assert found is not None, (start, end)
    return found.group(1)


def test_an_unknown_name_is_a_key_error_that_says_so() -> None:
    with pytest.raises(KeyError, match="no SQL statement is named 'nope'"):
        sql.query("nope")


def test_a_statement_leaves_out_its_description_and_keeps_its_inner_comments() -> None:
    assert sql.query("parent_exists") == "SELECT 1 FROM django_jobs_job WHERE id = %(parent)s"
    assert "-- One primary-key lookup" in sql.query("promote")
    assert not sql.query("promote").startswith("--")


def test_a_transition_that_does_not_exist_is_refused() -> None:
    with pytest.raises(ValueError, match="names no transition 'bury'"):
        sql.parse("-- name: x\n-- transition: bury\nSELECT 1\n", "test.sql")


def test_the_sql_files_are_package_data() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "store/sql/*.sql" in project["tool"]["setuptools"]["package-data"]["django_jobs"]
    assert {found.file for found in sql.QUERIES.values()} == {
        path.name for path in (ROOT / "django_jobs" / "store" / "sql").glob("*.sql")
    }


def test_cancelling_children_cancels_as_cancelling_a_job_does() -> None:
    sets = [
        _between(sql.query(name), " SET ", " FROM locked")
        for name in ("cancel_many", "cancel_children")
    ]
    assert sets[0] == sets[1]


def test_the_dependents_pages_are_read_alike() -> None:
    pages = [
        _between(sql.query(name), "WITH page AS (", "), candidates")
        for name in ("promote", "cancel_dependents")
    ]
    assert pages[0] == pages[1]


def test_a_prune_batch_is_counted_as_it_is_deleted() -> None:
    start, end = "WITH RECURSIVE batch AS (", "), last AS ("
    candidates = [
        _between(sql.query(name), start, end) for name in ("prune_batch", "prune_batch_count")
    ]
    assert candidates[0] == candidates[1]


def test_the_admins_delete_deletes_as_a_prune_batch_does() -> None:
    start, end = "FOR UPDATE OF j SKIP LOCKED ), children AS (", ") SELECT"
    deletes = [
        _between(sql.query(name), start, end) for name in ("prune_batch", "delete_finished_jobs")
    ]
    assert deletes[0] == deletes[1]


def test_the_listen_statements_name_the_channels_that_the_notifications_are_read_from() -> None:
    assert sql.query("listen_for_jobs") == f"LISTEN {db.CHANNEL}"
    assert sql.query("listen_for_handover") == f"LISTEN {wakeup.HANDOVER_CHANNEL}"
    assert f"pg_notify('{wakeup.HANDOVER_CHANNEL}'" in sql.query("hand_over_listening")
