"""Whose transaction the job system's statements run in, and what that transaction commits with.

- A transaction the job system opens itself commits durably (``synchronous_commit`` raised to
  ``on``) whatever the session, role or server says: every statement of it, the first or not.
- Inside a caller's ``transaction.atomic()``, the job system's statements are part of the
  caller's transaction: a rollback undoes them, the caller's commit (and its
  ``synchronous_commit``) decides their durability, and the caller's ``synchronous_commit``,
  ``statement_timeout`` and ``lock_timeout`` are what they were after them, whether the job
  system's statement came first in the block or later.

What a transaction committed with is read at its commit, by the server: a deferred constraint
trigger on each of the job system's tables records ``current_setting('synchronous_commit')`` as
the commit runs it.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from django.db import connection, transaction
from django.db.models import QuerySet
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from django_jobs import operator_actions, queues
from django_jobs.context import JobContext
from django_jobs.models import ApiToken, Job, Schedule
from django_jobs.schedules import declarations, ticks
from django_jobs.store import db
from django_jobs.tokens import auth
from testproject.testjobs.jobs import echo
from tests.conftest import connect
from tests.factories import JobFactory, ScheduleFactory, UserFactory
from tests.integration.helpers import logged_in

pytestmark = pytest.mark.django_db(transaction=True)

TABLES = [
    "django_jobs_job",
    "django_jobs_dependency",
    "django_jobs_queue",
    "django_jobs_schedule",
    "django_jobs_schedule_tick",
    "django_jobs_api_token",
]

#: The session's own values: none of them the job system's.
SESSION = {"synchronous_commit": "off", "statement_timeout": "123s", "lock_timeout": "7s"}
#: Values the caller sets for its own transaction only.
LOCAL = {"synchronous_commit": "local", "statement_timeout": "45s", "lock_timeout": "3s"}


def sql(statement: str, params: Any = None) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return cursor.fetchall() if cursor.description else []


@pytest.fixture
def commits() -> Iterator[Callable[[], set[tuple[str, str]]]]:
    """(table, synchronous_commit at commit) of each row written since the last call."""
    with connect() as conn:
        conn.execute(
            "CREATE TABLE test_commit_setting (tbl text, setting text);"
            " CREATE FUNCTION test_record_commit_setting() RETURNS trigger LANGUAGE plpgsql AS"
            " $$ BEGIN INSERT INTO test_commit_setting"
            " VALUES (TG_TABLE_NAME, current_setting('synchronous_commit')); RETURN NULL; END $$"
        )
        for table in TABLES:
            conn.execute(
                f"CREATE CONSTRAINT TRIGGER test_commit_setting AFTER INSERT OR UPDATE ON {table}"
                " DEFERRABLE INITIALLY DEFERRED FOR EACH ROW"
                " EXECUTE FUNCTION test_record_commit_setting()"
            )

    def seen() -> set[tuple[str, str]]:
        with connect() as conn:
            rows = conn.execute("DELETE FROM test_commit_setting RETURNING tbl, setting")
            return {(table, setting) for table, setting in rows.fetchall()}

    try:
        yield seen
    finally:
        with connect() as conn:
            for table in TABLES:
                conn.execute(f"DROP TRIGGER test_commit_setting ON {table}")
            conn.execute("DROP TABLE test_commit_setting; DROP FUNCTION test_record_commit_setting")


@pytest.fixture
def careless_session() -> Iterator[None]:
    """Django's connection, with a session that would commit lazily and wait without bound."""
    sql("; ".join(f"SET {name} = '{value}'" for name, value in SESSION.items()))
    try:
        yield
    finally:
        connection.close()  # the next test's connection starts with the server's settings


def shown() -> dict[str, str]:
    return {name: sql(f"SHOW {name}")[0][0] for name in SESSION}


def running_parent() -> JobContext:
    lease = str(uuid.uuid4())
    job = JobFactory(claimed=True, lease=lease)
    return JobContext(
        job_id=job.pk,
        task=job.task,
        attempt=job.attempt,
        max_attempts=job.max_attempts,
        worker_id=job.worker_id or "",
        lease=lease,
    )


def schedule(name: str = "every-minute", **fields: Any) -> Schedule:
    return ScheduleFactory(name=name, **fields)


def paused_schedule() -> Schedule:
    row = schedule()
    row.pause("tests")
    return row


def upstream() -> Job:
    return echo.enqueue(0)


#: What a caller can do with the job system inside its own transaction. Each takes what its
#: setup (the second item) made, before the caller's transaction began.
IN_CALLERS_TRANSACTION: dict[str, tuple[Callable[[Any], Any], Callable[[], Any]]] = {
    "enqueue": (lambda _: echo.enqueue(1), lambda: None),
    "enqueue with depends_on": (
        lambda up: echo.using(depends_on=[up]).enqueue(1),
        upstream,
    ),
    "enqueue_many": (lambda _: echo.enqueue_many([((1,), {}), ((2,), {})]), lambda: None),
    "enqueue_many with depends_on": (
        lambda up: echo.using(depends_on=[up]).enqueue_many([((1,), {}), ((2,), {})]),
        upstream,
    ),
    "spawn": (lambda parent: parent.spawn(echo, 1), running_parent),
    "queue resume": (lambda _: queues.resume("default"), lambda: queues.pause("default")),
    "queue limit": (lambda _: queues.set_limit("default", 2), lambda: None),
    "schedule run now": (lambda row: row.run_now(), schedule),
    "schedule resume": (lambda row: row.resume(), lambda: paused_schedule()),
    "token create": (lambda _: auth.create("t1", ["default"]), lambda: None),
}


#: Those that can be done twice in a row.
REPEATABLE = {"enqueue", "enqueue_many", "spawn", "queue limit"}


@pytest.mark.parametrize("first", [True, False], ids=["the block's first", "after SELECT 1"])
@pytest.mark.parametrize("name", list(IN_CALLERS_TRANSACTION))
def test_a_callers_transaction_keeps_its_settings_and_decides_the_commit(
    name: str, first: bool, careless_session: None, commits: Callable[[], set[Any]]
) -> None:
    action, setup = IN_CALLERS_TRANSACTION[name]
    made = setup()
    commits()
    with transaction.atomic():
        if not first:
            sql("SELECT 1")
        action(made)
        assert shown() == SESSION  # the caller's, not the job system's, for the rest of it
        sql("; ".join(f"SET LOCAL {key} = '{value}'" for key, value in LOCAL.items()))
        if name in REPEATABLE:
            action(made)
            assert shown() == LOCAL
    written = commits()
    assert written, "the action wrote nothing"
    assert {setting for _, setting in written} == {"local"}  # the caller's commit, as it set it


@pytest.mark.parametrize("first", [True, False], ids=["the block's first", "after SELECT 1"])
@pytest.mark.parametrize("name", list(IN_CALLERS_TRANSACTION))
def test_a_callers_rollback_undoes_what_the_job_system_wrote_in_it(
    name: str, first: bool, careless_session: None, commits: Callable[[], set[Any]]
) -> None:
    action, setup = IN_CALLERS_TRANSACTION[name]
    made = setup()
    commits()

    class Undo(Exception):
        pass

    with pytest.raises(Undo), transaction.atomic():
        if not first:
            sql("SELECT 1")
        action(made)
        raise Undo
    assert commits() == set()  # nothing of it was committed, before the caller's end or after


def _scheduler() -> psycopg.Cursor[Any]:
    conn = connect(options="-c synchronous_commit=off")
    return conn.cursor()


def _overdue_schedule_and_scheduler() -> psycopg.Cursor[Any]:
    schedule()
    sql("UPDATE django_jobs_schedule SET next_run_at = now() - interval '1 second'")
    return _scheduler()


QUEUE_ADD = reverse("admin:django_jobs_queue_add")
SCHEDULE_FORM = {
    "name": "every-minute",
    "task": "tests.echo",
    "cron": "* * * * *",
    "timezone": "UTC",
    "args": "[]",
    "kwargs": "{}",
    "queue": "",
    "priority": "",
    "catch_up": "skip",
    "overlap": "allow",
    "when_queue_paused": "skip",
}
FUTURE = timezone.now() + timedelta(days=1)


def _change_url() -> str:
    row = Schedule.objects.get(name="every-minute")
    return reverse("admin:django_jobs_schedule_change", args=[row.pk])


def _saved(admin: Client, url: str, data: dict[str, str]) -> None:
    response = admin.post(url, data)
    assert response.status_code == 302, response.content.decode()[-2000:]


def _admin() -> Client:
    return logged_in(UserFactory(username="root", superuser=True))


def _jobs(**fields: Any) -> QuerySet[Job]:
    job = JobFactory(**fields)
    return Job.objects.filter(pk=job.pk)


def _sync_on_django_connection() -> None:
    with connection.cursor() as cursor:
        declarations.sync(cursor)


#: The job system's own transactions, each with what its setup made.
OWN: dict[str, tuple[Callable[[Any], Any], Callable[[], Any]]] = {
    **IN_CALLERS_TRANSACTION,
    "schedule pause": (lambda row: row.pause("tests"), schedule),
    "schedule edit": (lambda row: row.recompute_next_run(), schedule),
    "schedule tick": (
        lambda scheduler: ticks.fire_due(scheduler, ["tests.echo"]),
        _overdue_schedule_and_scheduler,
    ),
    "schedule sync": (declarations.sync, _scheduler),
    "schedule sync on Django's connection": (lambda _: _sync_on_django_connection(), lambda: None),
    "queue pause": (lambda _: queues.pause("default"), lambda: None),
    "queue limit in the admin": (
        lambda admin: _saved(admin, QUEUE_ADD, {"name": "default", "concurrency_limit": "4"}),
        lambda: _admin(),
    ),
    "schedule edit in the admin": (
        lambda admin: _saved(admin, _change_url(), {**SCHEDULE_FORM, "cron": "5 * * * *"}),
        lambda: (schedule(source="admin"), _admin())[1],
    ),
    "operator retry": (
        operator_actions.retry,
        lambda: _jobs(state=Job.State.ERROR, finished_at=timezone.now()),
    ),
    "operator cancel": (operator_actions.cancel, lambda: _jobs()),
    "operator run now": (operator_actions.run_now, lambda: _jobs(run_after=FUTURE)),
    "token revoke": (lambda token: auth.revoke([token.pk]), lambda: auth.create("t2", ["q"])[0]),
}


@pytest.mark.parametrize("name", list(OWN))
def test_the_job_systems_own_transactions_commit_durably(
    name: str, careless_session: None, commits: Callable[[], set[Any]]
) -> None:
    action, setup = OWN[name]
    made = setup()
    commits()
    try:
        action(made)
    finally:
        if isinstance(made, psycopg.Cursor):
            made.connection.close()
    written = commits()
    assert written, "the action wrote nothing"
    assert {setting for _, setting in written} == {"on"}, written
    assert shown() == SESSION  # and the session's own settings are left as they were


def test_a_statement_of_the_job_systems_own_transaction_runs_with_its_settings_whatever_came_first(
    careless_session: None,
) -> None:
    with connection.cursor() as cursor, db.transaction(cursor):
        first = db.execute(cursor, "SELECT current_setting('synchronous_commit')").fetchone()
        db.execute(cursor, "SELECT 1")
        later = db.execute(cursor, "SHOW synchronous_commit").fetchone()
        timeout = db.execute(cursor, "SHOW statement_timeout").fetchone()
    assert first == later == ("on",) and timeout != (SESSION["statement_timeout"],)
    assert shown() == SESSION


#: Admin pages that run inside ATOMIC_REQUESTS' transaction, where the site has it on.
IN_THE_REQUESTS_TRANSACTION: dict[str, tuple[str, dict[str, Any], Callable[[], Any]]] = {
    "queue pause": (
        "admin:django_jobs_queue_changelist",
        {"action": "pause_queues", "_selected_action": ["default"]},
        lambda: queues.set_limit("default", 2),
    ),
    "queue resume": (
        "admin:django_jobs_queue_changelist",
        {"action": "resume_queues", "_selected_action": ["default"]},
        lambda: queues.pause("default"),
    ),
    "queue limit": (
        "admin:django_jobs_queue_add",
        {"name": "default", "concurrency_limit": "4"},
        lambda: None,
    ),
    "token revoke": (
        "admin:django_jobs_apitoken_changelist",
        {"action": "revoke_tokens", "_selected_action": ["1"]},
        lambda: auth.create("t3", ["q"]),
    ),
}


@pytest.mark.parametrize("name", list(IN_THE_REQUESTS_TRANSACTION))
def test_the_admins_writes_commit_durably_under_atomic_requests(
    name: str,
    careless_session: None,
    commits: Callable[[], set[Any]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url, data, setup = IN_THE_REQUESTS_TRANSACTION[name]
    setup()
    if name == "token revoke":
        data = {**data, "_selected_action": [str(ApiToken.objects.get().pk)]}
    admin = _admin()
    monkeypatch.setitem(connection.settings_dict, "ATOMIC_REQUESTS", True)
    commits()
    response = admin.post(reverse(url), data)
    assert response.status_code == 302, response.content.decode()[-2000:]
    written = commits()
    assert written, "the page wrote nothing"
    assert {setting for _, setting in written} == {"on"}, written
    assert shown() == SESSION
