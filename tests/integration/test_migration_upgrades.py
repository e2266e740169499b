"""Upgrades: the migrations apply on a database at an earlier migration, and keep its rows.

Each test works on scratch databases next to the test database (created and dropped here; the
test database is never migrated back). One is migrated from nothing, one migration at a time,
and its schema (functions, views, indexes, constraints, columns, storage parameters) is read
after each migration: that is what a fresh database looks like at every step. The others are
migrated to an old migration, filled with rows in every table that exists there, migrated to
the latest migration, and then must hold the same rows, let a worker claim and finish their
jobs, and have exactly the fresh schema. Going back and forward again keeps the rows too.

A fresh database and an upgraded one run the same migration code, so comparing them cannot see
a migration whose code was rewritten to make something else. tests/data/migrations.json can: it
holds what each migration made when it was written (see RECORDED), and every run checks each
migration against it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.migrations.executor import MigrationExecutor
from django.db.utils import load_backend
from psycopg.types.json import Jsonb

from django_jobs import store
from django_jobs.models import Job
from django_jobs.store import Ended, Lease
from tests.conftest import ROOT, connect

pytestmark = pytest.mark.django_db

APP = "django_jobs"
INITIAL = "0001_initial"
PROGRESS = "0014_progress_and_logs"

# Fixed times, so that a row read back compares equal to the row written.
BEFORE = "2026-11-01T09:00:00+00:00"
T0 = "2026-11-01T10:00:00+00:00"
T1 = "2026-11-01T10:05:00+00:00"
T2 = "2026-11-01T10:06:00+00:00"
FUTURE = "2099-01-01T00:00:00+00:00"

#: What each migration made when it was written, as :func:`recordable` keeps it (test
#: ``test_each_migration_makes_what_it_made_when_it_was_recorded``). Migrations that have run on
#: users' databases must go on making the same functions, views, columns, indexes and
#: constraints, however their code is rewritten, so an entry is never edited. A new migration's
#: entry is added by running this module with RECORD_MIGRATIONS=1.
RECORDED = ROOT / "tests" / "data" / "migrations.json"

#: A worker that claims after the upgrade.
UPGRADED_WORKER = "upgrade:1:000000"

Rows = dict[str, dict[Any, dict[str, Any]]]
Schema = dict[str, dict[str, Any]]

# ---------------------------------------------------------------- scratch databases


@contextlib.contextmanager
def scratch_database(suffix: str) -> Iterator[BaseDatabaseWrapper]:
    """An empty database named after the test database, as a Django connection (its alias is
    registered while it exists, so that code that looks a connection up by alias finds it)."""
    name = f"{connection.settings_dict['NAME']}_{suffix}"
    alias = f"upgrade_{suffix}"
    with connect() as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')
    settings = {**connection.settings_dict, "NAME": name}
    db = load_backend(settings["ENGINE"]).DatabaseWrapper(settings, alias)
    # Connected before its alias is registered: Django's test case lets a test open
    # connections it makes itself, but not those of aliases it was not told about.
    db.ensure_connection()
    connections.settings[alias] = settings
    connections[alias] = db
    try:
        yield db
    finally:
        db.close()
        del connections[alias]
        del connections.settings[alias]
        with connect() as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def migration_names(db: BaseDatabaseWrapper) -> list[str]:
    """The app's migrations, first to latest."""
    graph = MigrationExecutor(db).loader.graph
    (leaf,) = graph.leaf_nodes(APP)
    return [name for app, name in graph.forwards_plan(leaf) if app == APP]


def migrate(db: BaseDatabaseWrapper, target: str) -> None:
    """Migrate the app forwards or backwards to ``target``, as ``migrate django_jobs target``."""
    executor = MigrationExecutor(db)
    targets = [(APP, target)]
    executor.migrate(targets, plan=executor.migration_plan(targets))
    assert applied(db)[-1] == target


def applied(db: BaseDatabaseWrapper) -> list[str]:
    return sorted(
        name for app, name in MigrationExecutor(db).loader.applied_migrations if app == APP
    )


def fetch(db: BaseDatabaseWrapper, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
    with db.cursor() as cursor:
        cursor.execute(sql, params)
        return list(cursor.fetchall())


def schema(db: BaseDatabaseWrapper) -> Schema:
    """What the migrations made in ``db``, by kind and name, as PostgreSQL prints it back."""
    queries = {
        "functions": """
            SELECT p.oid::regprocedure::text, pg_get_functiondef(p.oid) FROM pg_proc p
            WHERE p.proname LIKE 'django\\_jobs%%'""",
        # Apart from pg_get_functiondef's, which PostgreSQL prints: as written, for recording.
        "function sources": """
            SELECT p.oid::regprocedure::text,
                   jsonb_build_array(pg_get_function_result(p.oid), l.lanname, p.provolatile,
                                     p.proparallel, p.proisstrict, p.prosecdef, p.prosrc)::text
            FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
            WHERE p.proname LIKE 'django\\_jobs%%'""",
        "views": """
            SELECT viewname, definition FROM pg_views WHERE viewname LIKE 'django\\_jobs%%'""",
        "indexes": """
            SELECT i.tablename || '.' || i.indexname,
                   i.indexdef || CASE WHEN x.indisvalid THEN '' ELSE ' INVALID' END
            FROM pg_indexes i
            JOIN pg_index x ON x.indexrelid = (quote_ident(i.schemaname) || '.'
                                               || quote_ident(i.indexname))::regclass
            WHERE i.tablename LIKE 'django\\_jobs%%'""",
        "constraints": """
            SELECT conrelid::regclass::text || '.' || conname, pg_get_constraintdef(oid)
            FROM pg_constraint
            WHERE conrelid::regclass::text LIKE 'django\\_jobs%%'
              AND contype <> 'n'  -- PostgreSQL 18 lists NOT NULL here too; columns have it""",
        # By name, not position: going back drops columns, and forward adds them at the end.
        "columns": """
            SELECT c.relname || '.' || a.attname,
                   jsonb_build_array(format_type(a.atttypid, a.atttypmod), a.attnotnull,
                                     pg_get_expr(d.adbin, d.adrelid))::text
            FROM pg_attribute a
            JOIN pg_class c ON c.oid = a.attrelid
            LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
            WHERE c.relname LIKE 'django\\_jobs%%' AND c.relkind IN ('r', 'v')
              AND a.attnum > 0 AND NOT a.attisdropped""",
        "view columns": """
            SELECT c.relname, string_agg(a.attname || ' ' || format_type(a.atttypid, a.atttypmod),
                                         ', ' ORDER BY a.attnum)
            FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
            WHERE c.relname LIKE 'django\\_jobs%%' AND c.relkind = 'v' AND a.attnum > 0
            GROUP BY c.relname""",
        "storage": """
            SELECT relname, array_to_string(reloptions, ',') FROM pg_class
            WHERE relname LIKE 'django\\_jobs%%' AND reloptions IS NOT NULL""",
    }
    return {kind: dict(fetch(db, sql)) for kind, sql in queries.items()}


def assert_same_schema(actual: Schema, expected: Schema, where: str) -> None:
    for kind in expected:
        got, want = actual[kind], expected[kind]
        assert got.keys() == want.keys(), (
            f"{where}: {kind} differ from a fresh database's: "
            f"extra {sorted(got.keys() - want.keys())}, missing {sorted(want.keys() - got.keys())}"
        )
        for name in want:
            assert got[name] == want[name], (
                f"{where}: {name} ({kind}) differs from a fresh database's:\n"
                f"--- upgraded\n{got[name]}\n--- fresh\n{want[name]}"
            )


def recordable(made: Schema) -> dict[str, Any]:
    """What :data:`RECORDED` keeps of a schema: only what every PostgreSQL version prints
    alike. A function by a fingerprint of its arguments, result, language, volatility,
    parallel safety, strictness, security and source (without ``--`` comments, with its
    whitespace collapsed); a view by its columns; a table's columns by type and nullability;
    indexes and constraints by name."""

    def fingerprint(source: str) -> str:
        *attributes, body = json.loads(source)
        body = " ".join(re.sub(r"--[^\n]*", " ", body).split())
        return hashlib.sha256(json.dumps([*attributes, body]).encode()).hexdigest()

    return {
        "functions": {name: fingerprint(s) for name, s in sorted(made["function sources"].items())},
        "views": dict(sorted(made["view columns"].items())),
        "columns": {
            name: " ".join((kind, "not null" if not_null else "null"))
            for name, (kind, not_null, _) in sorted(
                (name, json.loads(c)) for name, c in made["columns"].items()
            )
            if name.split(".")[0] not in made["view columns"]
        },
        "indexes": {name: True for name in sorted(made["indexes"])},
        "constraints": {name: True for name in sorted(made["constraints"])},
    }


def changes(before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """What a migration changed, kind by kind: new values by name, and None for what it removed."""
    changed = {}
    for kind, values in after.items():
        old = before.get(kind, {})
        delta = {k: v for k, v in values.items() if old.get(k) != v}
        delta.update({k: None for k in old.keys() - values.keys()})
        if delta:
            changed[kind] = dict(sorted(delta.items()))
    return changed


@pytest.fixture(scope="module")
def fresh(django_db_setup: None, django_db_blocker: Any) -> dict[str, Schema]:
    """The schema of a fresh database after each migration, by migration name."""
    with django_db_blocker.unblock(), scratch_database("fresh") as db:
        schemas = {}
        for name in migration_names(db):
            migrate(db, name)
            schemas[name] = schema(db)
        return schemas


# ---------------------------------------------------------------- rows


def insert(db: BaseDatabaseWrapper, table: str, **values: Any) -> Any:
    """Insert one row of plain SQL values (a dict or list is stored as JSON); its primary key."""
    params = [Jsonb(v) if isinstance(v, dict | list) else v for v in values.values()]
    key = "name" if table == "django_jobs_queue" else "id"
    sql = (
        f"INSERT INTO {table} ({', '.join(values)}) VALUES ({', '.join(['%s'] * len(values))})"
        f" RETURNING {key}"
    )
    return fetch(db, sql, params)[0][0]


def dump(db: BaseDatabaseWrapper, tables: list[str]) -> Rows:
    """Every row of ``tables``, by table and primary key, with its values as JSON has them."""
    rows: Rows = {}
    for table in tables:
        found = fetch(db, f"SELECT to_jsonb(t)::text FROM {table} t")
        values = [json.loads(text) for (text,) in found]
        key = "name" if table == "django_jobs_queue" else "id"
        rows[table] = {row[key]: row for row in values}
    return rows


def assert_kept(before: Rows, after: Rows, where: str) -> None:
    """Every row of ``before`` is in ``after``, with the same values in the columns it had."""
    for table, rows in before.items():
        assert after[table].keys() == rows.keys(), f"{where}: the rows of {table} changed"
        for key, row in rows.items():
            kept = {column: after[table][key].get(column, "<no column>") for column in row}
            assert kept == row, f"{where}: {table} row {key} changed"


def only_columns(rows: Rows, like: Rows) -> Rows:
    """``rows`` with only the columns that the rows of ``like`` have, table by table."""
    columns = {table: set().union(*map(set, r.values())) for table, r in like.items()}
    return {
        table: {
            key: {c: v for c, v in row.items() if c in columns[table]} for key, row in r.items()
        }
        for table, r in rows.items()
    }


def job(db: BaseDatabaseWrapper, job_id: int) -> dict[str, Any]:
    return dump(db, ["django_jobs_job"])["django_jobs_job"][job_id]


def attempts_of(db: BaseDatabaseWrapper, job_id: int) -> list[dict[str, Any]]:
    rows = dump(db, ["django_jobs_attempt"])["django_jobs_attempt"].values()
    return sorted((r for r in rows if r["job_id"] == job_id), key=lambda r: r["number"])


def claim(db: BaseDatabaseWrapper) -> store.ClaimedJob | None:
    with db.cursor() as cursor:
        return store.claim(cursor, UPGRADED_WORKER, None)


def finish(db: BaseDatabaseWrapper, lease: Lease, outcome: str, **options: Any) -> Ended | None:
    with db.cursor() as cursor:
        return store.finish(cursor, lease, outcome, **options)


TABLES_0001 = [
    "django_jobs_job",
    "django_jobs_attempt",
    "django_jobs_dependency",
    "django_jobs_worker",
]
TABLES_0014 = [
    *TABLES_0001,
    "django_jobs_schedule",
    "django_jobs_schedule_tick",
    "django_jobs_queue",
]


def assert_fills_every_table(db: BaseDatabaseWrapper, tables: list[str]) -> None:
    """``tables`` are the app's tables in ``db``, and each has rows."""
    found = fetch(
        db,
        "SELECT tablename FROM pg_tables WHERE tablename LIKE 'django\\_jobs%%' ORDER BY 1",
    )
    assert [name for (name,) in found] == sorted(tables)
    for table in tables:
        assert fetch(db, f"SELECT count(*) FROM {table}")[0][0] > 0, f"{table} is empty"


def fill_0001(db: BaseDatabaseWrapper) -> dict[str, Any]:
    """Rows in every table of migration 0001: jobs in every state, their attempts, dependencies
    and workers. Returns the job ids by name."""
    w1, w2 = "pod-a:1:aaaaaa", "pod-b:7:bbbbbb"
    insert(db, "django_jobs_worker", id=w1, name="pod-a", host="pod-a.local", pid=1,
           queues=["default"], concurrency=4, started_at=BEFORE, last_seen_at=T1)  # fmt: skip
    insert(db, "django_jobs_worker", id=w2, name="pod-b", host="pod-b.local", pid=7,
           queues=["default", "reports"], concurrency=2, started_at=BEFORE,
           last_seen_at=T2)  # fmt: skip

    def add_job(**values: Any) -> int:
        defaults = {"task": "tests.noop", "queue": "default", "created_at": BEFORE}
        return int(insert(db, "django_jobs_job", **{**defaults, **values}))

    ids = {
        # Tried once (its worker was lost) and pending again: the one ready job.
        "pending": add_job(
            task="tests.echo", priority=5, state="pending", args=[1, "two", {"three": 3}],
            kwargs={"k": "v", "none": None}, attempt=1, max_attempts=3, timeout=30,
            run_after=T0, error="lost: worker pod-c vanished", unique_key="echo-1",
        ),
        "running": add_job(
            task="tests.sleep", state="running", args=[600], attempt=1, max_attempts=2,
            timeout=900, run_after=T0, worker_id=w1, started_at=T1, unique_key="sleep-1",
        ),
        "done": add_job(
            state="done", attempt=2, max_attempts=3, run_after=T0, worker_id=w2, started_at=T1,
            finished_at=T2, result={"answer": 42, "items": [1, 2]},
        ),
        "error": add_job(
            task="tests.fail", state="error", attempt=3, max_attempts=3, run_after=T0,
            worker_id=w2, started_at=T1, finished_at=T2, error="ValueError: bad input",
        ),
        "cancelled": add_job(
            queue="reports", state="cancelled", cancel_requested=True, run_after=T0,
            finished_at=T1,
        ),
        "waiting": add_job(queue="reports", state="waiting", priority=-3, run_after=T0),
    }  # fmt: skip
    # A child of the running job, not ready before 2099.
    ids["child"] = add_job(state="pending", run_after=FUTURE, parent_id=ids["running"])

    def add_attempt(name: str, number: int, outcome: str, worker: str, **values: Any) -> None:
        insert(db, "django_jobs_attempt", job_id=ids[name], number=number, outcome=outcome,
               worker_id=worker, started_at=T0, **values)  # fmt: skip

    add_attempt("pending", 1, "lost", "pod-c:1:cccccc", finished_at=T1,
                error="lost: worker pod-c vanished")  # fmt: skip
    add_attempt("running", 1, "running", w1)
    add_attempt("done", 1, "error", w2, finished_at=T1, error="KeyError: 'x'",
                traceback="Traceback (most recent call last):\nKeyError: 'x'\n")  # fmt: skip
    add_attempt("done", 2, "done", w2, finished_at=T2)
    for number, outcome in enumerate(("error", "crashed", "timeout"), start=1):
        add_attempt("error", number, outcome, w2, finished_at=T2, error=f"{outcome}: it broke")
    for upstream in ("pending", "done"):
        insert(db, "django_jobs_dependency", job_id=ids["waiting"], depends_on_id=ids[upstream])
    return ids


# ---------------------------------------------------------------- tests


def test_each_migration_makes_what_it_made_when_it_was_recorded(
    fresh: dict[str, Schema],
) -> None:
    recorded = json.loads(RECORDED.read_text()) if RECORDED.exists() else {}
    made = {name: recordable(schema) for name, schema in fresh.items()}
    new = [name for name in made if name not in recorded]
    if new and os.environ.get("RECORD_MIGRATIONS"):
        for name in new:
            index = list(made).index(name)
            recorded[name] = changes(made[list(made)[index - 1]] if index else {}, made[name])
        RECORDED.write_text(json.dumps(recorded, indent=1) + "\n")
        new = []
    assert not new, (
        f"record what {', '.join(new)} made: RECORD_MIGRATIONS=1 python -m pytest "
        f"{Path(__file__).relative_to(ROOT)} -k recorded"
    )
    assert list(recorded) == list(made), "a recorded migration is gone, or out of order"
    expected: dict[str, dict[str, Any]] = {kind: {} for kind in made[INITIAL]}
    for name, changed in recorded.items():
        for kind, values in changed.items():
            for key, value in values.items():
                if value is None:
                    del expected[kind][key]
                else:
                    expected[kind][key] = value
        for kind, want in expected.items():
            got = made[name][kind]
            differ = sorted(k for k in want.keys() | got.keys() if want.get(k) != got.get(k))
            assert not differ, (
                f"after {name}, these {kind} are not what the migrations made when they were "
                f"recorded in {RECORDED.name}: {differ}"
            )


def test_upgrading_from_0001_keeps_the_rows_and_gives_the_fresh_schema(
    fresh: dict[str, Schema],
) -> None:
    names = list(fresh)
    latest = names[-1]
    with scratch_database("from_0001") as db:
        migrate(db, INITIAL)
        ids = fill_0001(db)
        assert_fills_every_table(db, TABLES_0001)
        before = dump(db, TABLES_0001)
        assert {t: len(r) for t, r in before.items()} == {
            "django_jobs_job": 7,
            "django_jobs_attempt": 7,
            "django_jobs_dependency": 2,
            "django_jobs_worker": 2,
        }

        migrate(db, latest)

        assert_same_schema(schema(db), fresh[latest], f"upgraded from {INITIAL}")
        after = dump(db, TABLES_0001)
        assert_kept(before, after, f"upgraded from {INITIAL}")
        # The columns added since 0001 hold their defaults on the old rows.
        for row in after["django_jobs_job"].values():
            assert {
                column: row[column]
                for column in (
                    "lease", "parent_attempt", "task_missing_since", "concurrency_key",
                    "concurrency_limit", "progress_done", "progress_total", "progress_message",
                    "progress_updated_at", "progress_attempt",
                )
            } == {
                "lease": None, "parent_attempt": None, "task_missing_since": None,
                "concurrency_key": None, "concurrency_limit": None, "progress_done": None,
                "progress_total": None, "progress_message": "", "progress_updated_at": None,
                "progress_attempt": None,
            }  # fmt: skip
        for row in after["django_jobs_attempt"].values():
            assert (row["lease"], row["log"]) == (None, "")
        for row in after["django_jobs_worker"].values():
            assert (row["boot_id"], row["pod"], row["tasks"]) == ("", "", [])
        # The current models read the old rows.
        for name, job_id in ids.items():
            job_row = Job.objects.using(db.alias).get(pk=job_id)
            assert (job_row.state, job_row.args) == (
                before["django_jobs_job"][job_id]["state"],
                before["django_jobs_job"][job_id]["args"],
            ), name

        # A job enqueued after the upgrade takes the next id.
        new = Job.objects.using(db.alias).create(task="tests.noop", args=["new"])
        assert new.id > max(ids.values())

        # The claim takes the ready upgraded job first (priority 5), then the new one; no other
        # job is ready (the child's time has not come, the waiting job waits).
        first = claim(db)
        assert first is not None
        assert (first.id, first.task, first.queue, first.attempt, first.max_attempts) == (
            ids["pending"], "tests.echo", "default", 2, 3,
        )  # fmt: skip
        assert json.loads(first.args_json) == [1, "two", {"three": 3}]
        assert json.loads(first.kwargs_json) == {"k": "v", "none": None}
        assert (first.timeout, first.parent_id, first.lease.worker_id) == (
            30,
            None,
            UPGRADED_WORKER,
        )
        assert first.lease.token is not None
        second = claim(db)
        assert second is not None and second.id == new.id
        assert claim(db) is None

        assert finish(db, first.lease, "done", result_json='{"ok": true}') == Ended(
            ids["pending"], "done", None, has_dependents=True, has_children=False
        )
        finished = job(db, ids["pending"])
        assert (finished["state"], finished["attempt"], finished["result"]) == (
            "done", 2, {"ok": True},
        )  # fmt: skip
        assert [
            (a["number"], a["outcome"], a["lease"]) for a in attempts_of(db, ids["pending"])
        ] == [
            (1, "lost", None),
            (2, "done", first.lease.token),
        ]
        # The job claimed before the upgrade (no lease token then) is finished by its worker;
        # its unfinished child makes it wait.
        old_lease = Lease(ids["running"], 1, "pod-a:1:aaaaaa", None)
        assert finish(db, old_lease, "done") == Ended(
            ids["running"], "waiting", None, has_dependents=False, has_children=True
        )
        assert [a["outcome"] for a in attempts_of(db, ids["running"])] == ["done"]
        assert finish(db, second.lease, "error", error="boom", retryable=False) == Ended(
            new.id, "error", None, has_dependents=False, has_children=False
        )

        # Back to 0001 one migration at a time: each step leaves the schema a fresh database
        # has at that migration, and the rows keep the columns 0001 had.
        at_latest = only_columns(dump(db, TABLES_0001), before)
        for name in reversed(names[:-1]):
            migrate(db, name)
            assert_same_schema(schema(db), fresh[name], f"migrated back to {name}")
        assert_kept(at_latest, dump(db, TABLES_0001), f"migrated back to {INITIAL}")
        migrate(db, latest)
        assert_same_schema(schema(db), fresh[latest], f"migrated back to {INITIAL} and forward")
        assert_kept(at_latest, dump(db, TABLES_0001), f"migrated back to {INITIAL} and forward")


def fill_0014(db: BaseDatabaseWrapper) -> dict[str, Any]:
    """Rows in every table of migration 0014, with the columns added since 0001 set: jobs in
    every state (one running under a lease, with progress and a concurrency key), their
    attempts (with a captured log), dependencies, workers, a schedule and its ticks, and a
    paused and a limited queue. Returns the job ids by name."""
    w1 = "pod-a:2:aaaaaa"
    insert(db, "django_jobs_worker", id=w1, name="pod-a", host="pod-a.local", pid=2,
           queues=["default", "limited"], concurrency=4, started_at=BEFORE, last_seen_at=T1,
           boot_id="containerd://abc", pod="pod-a",
           tasks=["tests.echo", "tests.sleep"])  # fmt: skip
    insert(db, "django_jobs_queue", name="paused-q", paused=True, paused_at=T0, paused_by="ops",
           pause_reason="maintenance", updated_at=T0)  # fmt: skip
    insert(db, "django_jobs_queue", name="limited", concurrency_limit=1, limit_source="admin",
           updated_at=T0)  # fmt: skip
    lease = str(uuid.UUID(int=0x5EED))

    def add_job(**values: Any) -> int:
        defaults = {"task": "tests.noop", "queue": "default", "created_at": BEFORE}
        return int(insert(db, "django_jobs_job", **{**defaults, **values}))

    ids = {
        # Ready; a worker without its task had handed it back: the one job a claim can take.
        "pending": add_job(
            task="tests.echo", priority=5, state="pending", args=["a", 2], kwargs={"x": [1]},
            attempt=1, max_attempts=4, timeout=30, run_after=T0, unique_key="echo-2",
            task_missing_since=T1,
        ),
        # Ready, but its queue is paused.
        "paused": add_job(queue="paused-q", priority=9, state="pending", run_after=T0),
        # Ready, but its key's one slot is taken by the running job.
        "keyed": add_job(
            priority=8, state="pending", run_after=T0, concurrency_key="tenant-1",
            concurrency_limit=1,
        ),
        # Ready, but its queue's one slot is taken by the running job.
        "limited": add_job(queue="limited", priority=7, state="pending", run_after=T0),
        "running": add_job(
            task="tests.sleep", queue="limited", state="running", args=[600], attempt=1,
            max_attempts=2, timeout=900, run_after=T0, worker_id=w1, started_at=T1,
            lease=lease, concurrency_key="tenant-1", concurrency_limit=1, progress_done=3.0,
            progress_total=10.0, progress_message="3 of 10", progress_updated_at=T2,
            progress_attempt=1,
        ),
        "done": add_job(
            state="done", attempt=1, run_after=T0, worker_id=w1, started_at=T1, finished_at=T2,
            result={"rows": 12}, lease=str(uuid.UUID(int=1)),
        ),
        "error": add_job(
            task="tests.fail", state="error", attempt=1, max_attempts=1, run_after=T0,
            worker_id=w1, started_at=T1, finished_at=T2, error="RuntimeError: no",
            lease=str(uuid.UUID(int=2)),
        ),
        "cancelled": add_job(
            state="cancelled", cancel_requested=True, run_after=T0, finished_at=T1,
        ),
        "waiting": add_job(state="waiting", run_after=T0),
    }  # fmt: skip
    # A child that the running job's first attempt spawned, not ready before 2099.
    ids["child"] = add_job(
        state="pending", run_after=FUTURE, parent_id=ids["running"], parent_attempt=1
    )

    def add_attempt(name: str, number: int, outcome: str, **values: Any) -> None:
        insert(db, "django_jobs_attempt", job_id=ids[name], number=number, outcome=outcome,
               worker_id=w1, started_at=T0, **values)  # fmt: skip

    add_attempt("pending", 1, "released", finished_at=T1, error="task not registered")
    add_attempt("running", 1, "running", lease=lease, log="starting\n3 of 10\n")
    add_attempt("done", 1, "done", finished_at=T2, lease=str(uuid.UUID(int=1)), log="ok\n")
    add_attempt("error", 1, "error", finished_at=T2, lease=str(uuid.UUID(int=2)),
                error="RuntimeError: no",
                traceback="Traceback ...\nRuntimeError: no\n")  # fmt: skip
    insert(db, "django_jobs_dependency", job_id=ids["waiting"], depends_on_id=ids["pending"])
    schedule = insert(
        db, "django_jobs_schedule", name="nightly", task="tests.echo", cron="0 3 * * *",
        timezone="Europe/Paris", args=[1], kwargs={"full": True}, queue="", priority=None,
        catch_up="latest", overlap="skip", paused=False, paused_at=None, paused_by="",
        source="code", missing_from_code_since=None, next_run_at=FUTURE, last_run_at=T0,
        last_job_id=ids["done"], last_outcome="enqueued", created_at=BEFORE, updated_at=T0,
    )  # fmt: skip
    insert(db, "django_jobs_schedule_tick", schedule_id=schedule, fire_at=T0,
           job_id=ids["done"], outcome="enqueued", created_at=T0)  # fmt: skip
    insert(db, "django_jobs_schedule_tick", schedule_id=schedule, fire_at=BEFORE, job_id=None,
           outcome="skipped: overlap", created_at=BEFORE)  # fmt: skip
    return ids


def test_upgrading_from_0014_keeps_the_rows_and_going_back_and_forward_keeps_them(
    fresh: dict[str, Schema],
) -> None:
    latest = list(fresh)[-1]
    with scratch_database("from_0014") as db:
        migrate(db, PROGRESS)
        ids = fill_0014(db)
        assert_fills_every_table(db, TABLES_0014)
        before = dump(db, TABLES_0014)
        assert {t: len(r) for t, r in before.items()} == {
            "django_jobs_job": 10,
            "django_jobs_attempt": 4,
            "django_jobs_dependency": 1,
            "django_jobs_worker": 1,
            "django_jobs_schedule": 1,
            "django_jobs_schedule_tick": 2,
            "django_jobs_queue": 2,
        }

        migrate(db, latest)

        assert_same_schema(schema(db), fresh[latest], f"upgraded from {PROGRESS}")
        assert_kept(before, dump(db, TABLES_0014), f"upgraded from {PROGRESS}")

        # Back to 0014 and forward again: every row is kept whole.
        migrate(db, PROGRESS)
        assert_same_schema(schema(db), fresh[PROGRESS], f"migrated back to {PROGRESS}")
        assert dump(db, TABLES_0014) == before
        migrate(db, latest)
        assert_same_schema(schema(db), fresh[latest], f"migrated back to {PROGRESS} and forward")
        after = dump(db, TABLES_0014)
        assert only_columns(after, before) == before
        # The columns added since 0014 hold their defaults on the old rows.
        for row in after["django_jobs_schedule"].values():
            assert row["when_queue_paused"] == "skip"

        # The claim honours the upgraded queue controls: of the four ready jobs, only the one
        # in an open queue without a key can run.
        first = claim(db)
        assert first is not None
        assert (first.id, first.task, first.attempt, first.max_attempts, first.timeout) == (
            ids["pending"], "tests.echo", 2, 4, 30,
        )  # fmt: skip
        assert (json.loads(first.args_json), json.loads(first.kwargs_json)) == (
            ["a", 2],
            {"x": [1]},
        )
        assert claim(db) is None
        assert finish(db, first.lease, "done", result_json="[1]") == Ended(
            ids["pending"], "done", None, has_dependents=True, has_children=False
        )
        finished = job(db, ids["pending"])
        assert (finished["state"], finished["result"], finished["task_missing_since"]) == (
            "done", [1], None,
        )  # fmt: skip
        assert [(a["number"], a["outcome"]) for a in attempts_of(db, ids["pending"])] == [
            (1, "released"),
            (2, "done"),
        ]

        # The job running under its pre-upgrade lease is finished by its worker; its child
        # makes it wait, which frees its key's and its queue's slot.
        running = Lease(ids["running"], 1, "pod-a:2:aaaaaa", str(uuid.UUID(int=0x5EED)))
        assert finish(db, running, "done") == Ended(
            ids["running"], "waiting", None, has_dependents=False, has_children=True
        )
        (attempt,) = attempts_of(db, ids["running"])
        assert (attempt["outcome"], attempt["log"]) == ("done", "starting\n3 of 10\n")
        assert [claimed.id for claimed in iter(lambda: claim(db), None)] == [
            ids["keyed"],
            ids["limited"],
        ]
