"""The SQL of django_jobs/store/sql/: the loader, and the statements that repeat a piece of another
(final text has no fragments to share), checked to say the same."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from django_jobs.store import db, sql
from django_jobs.store.sql import functions
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
    data = project["tool"]["setuptools"]["package-data"]["django_jobs"]
    assert {"store/sql/*.sql", "store/sql/functions/*.sql"} <= set(data)
    folder = ROOT / "django_jobs" / "store" / "sql"
    assert {found.file for found in sql.QUERIES.values()} == {
        path.name for path in folder.glob("*.sql")
    } | {f"functions/{newest.file}" for newest in functions.newest()}
    assert {found.file for found in functions.FUNCTIONS.values()} == {
        path.name for path in (folder / "functions").glob("*.sql")
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


# ---------------------------------------------------------------------- each function kept once

PACKAGE = ROOT / "django_jobs"
FUNCTIONS_FOLDER = PACKAGE / "store" / "sql" / "functions"
_MAKES_A_FUNCTION = re.compile(r"CREATE\s+(?:OR\s+REPLACE\s+)?FUNCTION\s+(\w+)\s*\(", re.I)
#: The claim's write: the text of every branch of the claim function.
_CLAIM_WRITE = "SET state = 'running', attempt = attempt + 1"
#: The finish's decision of the next state (the retry arm of its CASE).
_NEXT_STATE = re.compile(r"WHEN \S+ AND attempt < max_attempts THEN 'pending'")


def _current_files() -> dict[str, str]:
    """The package's SQL and Python files as the database and the code use them, by path: every
    file but the migrations and the older versions of each function, which are history (a
    migration going backwards makes them again)."""
    newest = {FUNCTIONS_FOLDER / found.file for found in functions.newest()}
    found = {}
    for path in sorted([*PACKAGE.rglob("*.sql"), *PACKAGE.rglob("*.py")]):
        if "migrations" in path.relative_to(PACKAGE).parts:
            continue
        if path.parent == FUNCTIONS_FOLDER and path.suffix == ".sql" and path not in newest:
            continue
        found[str(path.relative_to(ROOT))] = _words(path.read_text())
    return found


def test_each_function_file_makes_the_function_and_version_it_is_named_for() -> None:
    versions: dict[str, list[int]] = {}
    for found in functions.FUNCTIONS.values():
        made = _MAKES_A_FUNCTION.findall(found.statement)
        assert made == [found.name], found.file
        versions.setdefault(found.name, []).append(found.version)
    assert all(numbers == list(range(1, len(numbers) + 1)) for numbers in versions.values())
    assert {found.name for found in functions.newest()} == {
        "django_jobs_claim",
        "django_jobs_finish",
        "django_jobs_keyed_candidate",
        "django_jobs_free_candidate",
        "django_jobs_setting",
        "django_jobs_checkpoint",
        "django_jobs_rate_room",
        "django_jobs_rate_take",
    }


def test_migrations_hold_no_function_text_of_their_own() -> None:
    # They load each version's file by name (functions.replace_function, function_sql).
    for path in sorted((PACKAGE / "migrations").glob("0*.py")):
        text = path.read_text()
        assert not _MAKES_A_FUNCTION.search(text), path.name
        assert "$body$" not in text and "$$" not in text, path.name


def test_the_package_holds_each_functions_current_text_once() -> None:
    current = _current_files()
    for newest in functions.newest():
        quoted = re.search(r"\$(\w*)\$(.*)\$\1\$", newest.statement, re.S)
        assert quoted is not None, newest.file
        body = _words(quoted.group(2))
        own = str((FUNCTIONS_FOLDER / newest.file).relative_to(ROOT))
        holders = [path for path, text in current.items() if body in text]
        assert holders == [own], f"{newest.name}'s body is also in {holders}"


def test_the_claims_text_is_in_the_claim_function_alone_and_once_a_branch() -> None:
    # The rule: among the named statements, the Python files and the newest version of each
    # function, the claim's write (and so its SELECT ... FOR NO KEY UPDATE SKIP LOCKED) is in the
    # claim function only, whose branches (one per index it claims through) each appear once.
    # Tests and bench read the branches out of that file (store.claim_branch).
    current = _current_files()
    holders = [path for path, text in current.items() if _CLAIM_WRITE in text]
    (claim,) = [found for found in functions.newest() if found.name == "django_jobs_claim"]
    assert holders == [str((FUNCTIONS_FOLDER / claim.file).relative_to(ROOT))]
    branches = [
        _words(branch) for branch in re.findall(r"RETURN QUERY(.*?);", claim.statement, re.S)
    ]
    assert all(_CLAIM_WRITE in branch for branch in branches)
    assert len(set(branches)) == len(branches) == 5


def test_the_next_state_of_an_ended_attempt_is_decided_in_one_place() -> None:
    # The finish function's CASE: the reaper's reap calls the finish rather than repeating it.
    holders = {
        path: len(_NEXT_STATE.findall(text))
        for path, text in _current_files().items()
        if _NEXT_STATE.search(text)
    }
    (finish,) = [found for found in functions.newest() if found.name == "django_jobs_finish"]
    assert holders == {str((FUNCTIONS_FOLDER / finish.file).relative_to(ROOT)): 1}


def test_the_listen_statements_name_the_channels_that_the_notifications_are_read_from() -> None:
    assert sql.query("listen_for_jobs") == f"LISTEN {db.CHANNEL}"
    assert sql.query("listen_for_handover") == f"LISTEN {wakeup.HANDOVER_CHANNEL}"
    assert f"pg_notify('{wakeup.HANDOVER_CHANNEL}'" in sql.query("hand_over_listening")


@pytest.mark.parametrize(
    ("function", "row_type"),
    [("django_jobs_claim", "ClaimRow"), ("django_jobs_finish", "FinishRow")],
)
def test_the_rows_of_the_hot_functions_are_read_by_their_column_names(
    function: str, row_type: str
) -> None:
    # The claim's and the finish's rows also come from execute_together, without column names:
    # their NamedTuples must list the function's columns in its RETURNS TABLE order.
    from django_jobs.store import claiming, ending

    declared = re.search(r"RETURNS TABLE \((.*?)\)\s*LANGUAGE", sql.query(function), re.S)
    assert declared is not None
    columns = [part.split()[0] for part in declared.group(1).split(",")]
    row = getattr(claiming, row_type, None) or getattr(ending, row_type)
    assert list(row._fields) == columns
