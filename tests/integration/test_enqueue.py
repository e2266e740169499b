from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext, override_settings
from django.utils import timezone

from django_jobs import InvalidOption, InvalidPayload, UnknownTask
from django_jobs.enqueue import enqueue
from django_jobs.models import Job
from django_jobs.store.sql import query
from testproject.examples.jobs import build_report
from testproject.testjobs.jobs import echo
from tests.conftest import connect
from tests.factories import JobFactory
from tests.timing import BUSY_MACHINE_MARGIN

pytestmark = pytest.mark.django_db


def test_enqueue_returns_the_stored_job() -> None:
    job = build_report.enqueue(42, fmt="csv")
    stored = Job.objects.get(pk=job.pk)
    assert stored.task == "testproject.examples.jobs.build_report"
    assert (stored.queue, stored.priority, stored.max_attempts, stored.timeout) == (
        "reports",
        0,
        2,
        120,
    )
    assert (stored.args, stored.kwargs) == ([42], {"fmt": "csv"})
    assert stored.state == Job.State.PENDING and stored.attempt == 0
    assert job.created_at == stored.created_at and job.run_after == stored.run_after


def test_using_sets_priority_and_an_absolute_run_after() -> None:
    at = timezone.now() + timedelta(hours=2)
    job = build_report.using(priority=50, run_after=at).enqueue(7)
    stored = Job.objects.get(pk=job.pk)
    assert stored.priority == 50
    assert stored.run_after == at


def test_a_relative_run_after_is_counted_from_database_time() -> None:
    job = echo.using(run_after=timedelta(minutes=10)).enqueue()
    with connection.cursor() as cursor:
        cursor.execute("SELECT run_after - now() FROM django_jobs_job WHERE id = %s", [job.pk])
        (delay,) = cursor.fetchone()
    assert delay == timedelta(minutes=10)


def test_enqueue_many_copies_the_rows_after_one_statement_and_keeps_order() -> None:
    with CaptureQueriesContext(connection) as queries:
        jobs = echo.enqueue_many(((i,), {"n": i}) for i in range(500))
    # One statement reserves the ids; the rows go in with COPY (not a statement Django logs).
    statements = [q["sql"] for q in queries if "SAVEPOINT" not in q["sql"]]
    assert len(statements) == 1 and "nextval" in statements[0]
    assert [j.args for j in jobs] == [[i] for i in range(500)]
    stored = list(
        Job.objects.filter(task="tests.echo").order_by("id").values_list("id", "args", "kwargs")
    )
    assert stored == [(job.pk, [i], {"n": i}) for i, job in enumerate(jobs)]


def test_enqueue_many_returns_jobs_equal_to_the_stored_rows() -> None:
    parent = echo.enqueue()
    calls = [((i, "x", None, True), {"nested": {"list": [i, 1.5]}}) for i in range(3)]
    task = echo.using(
        queue="reports", priority=5, max_attempts=7, timeout=30, run_after=timedelta(minutes=5)
    )
    jobs = task.using(parent=parent).enqueue_many(calls)
    fields = [field.attname for field in Job._meta.concrete_fields]
    for job in jobs:
        stored = Job.objects.get(pk=job.pk)
        assert {f: getattr(job, f) for f in fields} == {f: getattr(stored, f) for f in fields}
        assert job._state.adding is False and job._state.db == "default"
    assert [j.args for j in jobs] == [[i, "x", None, True] for i in range(3)]
    with connection.cursor() as cursor:
        cursor.execute("SELECT run_after - now() FROM django_jobs_job WHERE id = %s", [jobs[0].pk])
        assert cursor.fetchone()[0] == timedelta(minutes=5)
    # Ready now (run_after left to the column's default), and born cancelled (an upstream job
    # failed: finished_at and error set): the returned jobs still match the rows.
    failed = JobFactory(state="error", finished_at=timezone.now(), error="boom")
    for job in [
        *echo.enqueue_many([((), {})]),
        *echo.using(depends_on=[failed]).enqueue_many(calls),
    ]:
        stored = Job.objects.get(pk=job.pk)
        assert {f: getattr(job, f) for f in fields} == {f: getattr(stored, f) for f in fields}
    assert stored.state == "cancelled" and f"#{failed.pk}" in stored.error
    # They are ordinary model instances: they refresh, save and compare like fetched ones.
    jobs[1].priority = 9
    jobs[1].save(update_fields=["priority"])
    assert Job.objects.get(pk=jobs[1].pk).priority == 9
    assert jobs[2] == Job.objects.get(pk=jobs[2].pk) and jobs[2] != jobs[1]


def test_enqueue_returns_a_job_equal_to_the_stored_row() -> None:
    # Every variant of a single enqueue: with neither a unique key nor a parent (the plain
    # statement), with one of them, waiting on a dependency, born cancelled, due later.
    failed = JobFactory(state="error", finished_at=timezone.now(), error="boom")
    parent = echo.enqueue()
    fields = [field.attname for field in Job._meta.concrete_fields]
    for job in [
        parent,
        build_report.enqueue(42, fmt="csv"),
        echo.using(queue="reports", priority=5, max_attempts=7, timeout=30).enqueue(1.5, [1]),
        echo.using(run_after=timedelta(minutes=5), concurrency_key="k").enqueue(),
        echo.using(unique_key="one-of-a-kind").enqueue(),
        echo.using(parent=parent).enqueue(),
        echo.using(depends_on=[parent]).enqueue(),
        echo.using(depends_on=[failed]).enqueue(),
    ]:
        stored = Job.objects.get(pk=job.pk)
        assert {f: getattr(job, f) for f in fields} == {f: getattr(stored, f) for f in fields}
        assert job.__dict__.keys() == stored.__dict__.keys()
        assert job._state.adding is False and job._state.db == "default"
    assert stored.state == "cancelled" and stored.finished_at is not None
    # An ordinary model instance: it saves and compares like a fetched one.
    parent.priority = 9
    parent.save(update_fields=["priority"])
    assert Job.objects.get(pk=parent.pk).priority == 9 and parent == Job.objects.get(pk=parent.pk)


@pytest.mark.django_db(transaction=True)
def test_a_single_enqueue_in_autocommit_is_one_statement_that_notifies() -> None:
    # One statement, one round trip: its bounded waits and durable commit travel with it
    # (store/db.py), and so does the NOTIFY that wakes idle workers (delivered at its commit).
    for task, statement in [(echo, "insert_plain_job"), (echo.using(unique_key="u"), "insert_job")]:
        with CaptureQueriesContext(connection) as queries:
            task.enqueue()
        assert len(queries) == 1
        sql = queries[0]["sql"]
        assert query(statement).split("VALUES")[0] in sql and sql.startswith("SELECT set_config(")
        assert "pg_notify('django_jobs', queue)" in sql


@pytest.mark.django_db(transaction=True)
def test_an_enqueued_job_that_is_ready_wakes_idle_workers_at_commit() -> None:
    listener = connect()
    try:
        listener.execute("LISTEN django_jobs")
        with transaction.atomic():
            echo.using(queue="reports").enqueue()
            echo.using(run_after=timedelta(hours=1)).enqueue()  # not ready: no wake-up
            assert list(listener.notifies(timeout=0.2)) == []  # not before the commit
        # Sent at the commit: the wait is only for what a busy machine may add, and none would
        # come if the enqueue did not notify (a slow machine cannot fail the checks for none).
        woken = [n.payload for n in listener.notifies(timeout=BUSY_MACHINE_MARGIN, stop_after=1)]
        assert woken == ["reports"]
        assert list(listener.notifies(timeout=0.2)) == []
    finally:
        listener.close()


@pytest.mark.django_db(transaction=True)
def test_a_job_enqueued_in_a_rolled_back_transaction_never_existed() -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        echo.enqueue("lost")
        raise RuntimeError("abort")
    assert not Job.objects.exists()

    with transaction.atomic():
        kept = echo.enqueue("kept")
    assert Job.objects.get().pk == kept.pk


def test_enqueueing_an_unregistered_task_raises_and_writes_nothing() -> None:
    with pytest.raises(UnknownTask):
        enqueue("somewhere.not_a_task", [1])
    assert not Job.objects.exists()


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ([{1, 2}], {}, r"args\[0\] is a set, which is not JSON"),
        ([object()], {}, "is a object, which is not JSON"),
        ([float("nan")], {}, "which JSON cannot represent"),
        ([], {"when": timezone.now()}, r"kwargs\['when'\] is a datetime"),
        ([{1: "a"}], {}, "JSON object keys must be strings"),
    ],
)
def test_non_json_arguments_are_refused_and_nothing_is_written(args, kwargs, message) -> None:
    with pytest.raises(InvalidPayload, match=message):
        echo.enqueue(*args, **kwargs)
    assert not Job.objects.exists()


def _nested(depth: int) -> list:
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


UNSTORABLE = [
    (["a\x00b"], {}, r"args\[0\] contains a NUL character"),
    ([], {"note": "x\x00"}, r"kwargs\['note'\] contains a NUL character"),
    ([{"deep": ["\ud800"]}], {}, r"args\[0\]\['deep'\]\[0\] contains invalid Unicode"),
    ([{"k\x00": 1}], {}, "has a key .* that contains a NUL character"),
    ([_nested(5000)], {}, "nest lists or objects more than 100 levels deep"),
    ([10**5000], {}, "cannot be written as JSON"),
]


@pytest.mark.parametrize(("args", "kwargs", "message"), UNSTORABLE)
def test_what_postgresql_cannot_store_is_refused_and_nothing_is_written(
    args, kwargs, message
) -> None:
    with pytest.raises(InvalidPayload, match=message):
        echo.enqueue(*args, **kwargs)
    with pytest.raises(InvalidPayload, match=message):
        echo.enqueue_many([(("fine",), {}), (args, kwargs)])
    assert not Job.objects.exists()
    # Text that only looks like an escape is stored as it is.
    stored = echo.enqueue("\\u0000", "\\x00", "😀")
    stored.refresh_from_db()
    assert stored.args == ["\\u0000", "\\x00", "😀"]


@pytest.mark.django_db(transaction=True)
def test_a_parent_that_does_not_exist_is_refused_before_anything_is_written() -> None:
    kept = []
    for enqueue_it in (
        lambda: echo.using(parent=999_999_999).enqueue(),
        lambda: echo.using(parent=999_999_999).enqueue_many([((), {})]),
    ):
        with transaction.atomic():
            with pytest.raises(InvalidOption, match="parent job #999999999 does not exist"):
                enqueue_it()
            kept.append(echo.enqueue("the transaction goes on").pk)
    assert sorted(Job.objects.values_list("pk", flat=True)) == kept


@pytest.mark.parametrize(
    "options",
    [
        {"run_after": timedelta(days=10**8)},
        {"max_attempts": 2**31},
        {"timeout": 2**31},
        {"unique_key": "k\x00"},
    ],
)
def test_options_out_of_range_are_refused_before_anything_is_written(options) -> None:
    with pytest.raises(InvalidOption):
        echo.using(**options).enqueue()
    assert not Job.objects.exists()


@override_settings(JOBS_MAX_PAYLOAD_BYTES=1000)
def test_arguments_over_the_size_cap_are_refused() -> None:
    echo.enqueue("x" * 900)
    with pytest.raises(InvalidPayload, match="over JOBS_MAX_PAYLOAD_BYTES"):
        echo.enqueue("x" * 1000)
    with pytest.raises(InvalidPayload):
        echo.enqueue_many([(("ok",), {}), (("x" * 1000,), {})])
    assert Job.objects.count() == 1


def test_tuples_become_lists() -> None:
    job = echo.enqueue((1, 2), nested={"t": (3,)})
    assert Job.objects.get(pk=job.pk).args == [[1, 2]]
    assert Job.objects.get(pk=job.pk).kwargs == {"nested": {"t": [3]}}


def test_unique_key_returns_the_active_job_instead_of_a_duplicate() -> None:
    first = echo.using(unique_key="report:1").enqueue(1)
    second = echo.using(unique_key="report:1").enqueue(2)
    assert second.pk == first.pk
    assert Job.objects.count() == 1


def test_enqueue_many_refuses_a_unique_key() -> None:
    with pytest.raises(InvalidOption, match="cannot take a unique_key"):
        echo.using(unique_key="k").enqueue_many([((), {})])
