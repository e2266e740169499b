"""Dependencies, child jobs with fan-in, cancellation cascades and unique jobs."""

from __future__ import annotations

import threading

import pytest
from django.db import IntegrityError, connection, connections, transaction

from django_jobs import DependencyError, store, workflows
from django_jobs.models import Dependency, Job
from django_jobs.reaper import reap_pass
from testproject.testjobs.jobs import echo, fail, retry_then_succeed
from tests.factories import JobFactory
from tests.integration.helpers import CLAIM_INDEXES, uses_one_of

pytestmark = pytest.mark.django_db


def states(*jobs: Job) -> list[str]:
    return [Job.objects.get(pk=j.pk).state for j in jobs]


def finish_now(job: Job, outcome: str = "done", retryable: bool = False) -> str:
    """Claim ``job`` (it must be the only ready one) and end it, settling like a worker."""
    with connection.cursor() as cursor:
        claimed = store.claim(cursor, "w:1:000000", None)
        assert claimed is not None and claimed.id == job.pk
        ended = store.finish(
            cursor,
            claimed.lease,
            outcome,
            retryable=retryable,
            error="" if outcome == "done" else "boom",
        )
        if ended.needs_settling:
            workflows.settle(cursor, job.pk)
    return ended.state


def test_a_job_waits_until_every_dependency_is_done() -> None:
    a, b = echo.enqueue("a"), echo.enqueue("b")
    c = echo.using(depends_on=[a, b.pk]).enqueue("c")
    assert c.state == "waiting"
    assert list(c.dependencies) == [a, b] and list(a.dependents) == [c]
    assert finish_now(a) == "done"
    assert states(c) == ["waiting"]
    assert finish_now(b) == "done"
    assert states(c) == ["pending"]


def test_depending_on_a_done_job_is_immediately_runnable() -> None:
    a = echo.enqueue()
    finish_now(a)
    assert echo.using(depends_on=[a]).enqueue().state == "pending"


def test_unknown_dependencies_raise_and_write_nothing() -> None:
    a = echo.enqueue()
    with pytest.raises(DependencyError, match=r"do not exist: \[999999\]"):
        echo.using(depends_on=[a, 999999]).enqueue()
    with pytest.raises(DependencyError):
        echo.using(depends_on=[999999]).enqueue_many([((), {})])
    assert Job.objects.count() == 1 and not Dependency.objects.exists()


def test_a_job_cannot_depend_on_itself() -> None:
    a = echo.enqueue()
    with pytest.raises(IntegrityError), transaction.atomic():
        Dependency.objects.create(job=a, depends_on=a)


def test_a_failure_cancels_everything_downstream_naming_the_upstream_job() -> None:
    a = fail.enqueue()
    b = echo.using(depends_on=[a]).enqueue("b")
    c = echo.using(depends_on=[b]).enqueue("c")
    d = echo.using(depends_on=[c]).enqueue("d")
    side = echo.enqueue("side")
    assert finish_now(a, "error") == "error"
    assert states(b, c, d, side) == ["cancelled", "cancelled", "cancelled", "pending"]
    for job in (b, c, d):
        job.refresh_from_db()
        assert job.error == f"cancelled: upstream job #{a.pk} (tests.fail) ended error"
        assert job.finished_at is not None
    # A job enqueued after the failure is cancelled at once, for the same reason.
    late = echo.using(depends_on=[d]).enqueue()
    assert late.state == "cancelled" and f"#{d.pk}" in late.error


def test_a_retrying_dependency_propagates_nothing() -> None:
    a = retry_then_succeed.enqueue()
    b = echo.using(depends_on=[a]).enqueue()
    assert finish_now(a, "error", retryable=True) == "pending"
    assert states(b) == ["waiting"]


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_claim_ignores_100k_waiting_jobs_and_stays_on_the_index() -> None:
    blocker = echo.enqueue("blocker")
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO django_jobs_job (task, state)
            SELECT 'tests.echo', 'waiting' FROM generate_series(1, 100000)
            """
        )
        cursor.execute(
            "INSERT INTO django_jobs_dependency (job_id, depends_on_id)"
            " SELECT id, %s FROM django_jobs_job WHERE state = 'waiting'",
            [blocker.pk],
        )
        # As autovacuum would: the dead index entries that earlier tests' rolled-back rows left
        # must not decide the plan, only the 100k waiting jobs.
        cursor.execute("VACUUM ANALYZE django_jobs_job")
        sql, params = store.claim_sql(None)
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql, {"worker_id": "w:1:0", **params})
        plan = "\n".join(row[0] for row in cursor.fetchall())
    print("\n" + plan)
    assert uses_one_of(CLAIM_INDEXES, plan), plan
    # (The claim's guard reads the queue table, a row per paused or limited queue, whole.)
    assert "Sort" not in plan and "Seq Scan on django_jobs_job" not in plan
    assert Job.objects.get(pk=blocker.pk).state == "running"  # the one pending job


def test_repair_settles_what_a_crash_left_waiting() -> None:
    # A dependency finished, but the process died before promoting its dependent.
    dep = JobFactory(finished=True)
    dependent = JobFactory(state="waiting")
    Dependency.objects.create(job=dependent, depends_on=dep)
    # A parent's last child finished, but the parent was never finalized.
    parent = JobFactory(claimed=True)
    Job.objects.filter(pk=parent.pk).update(state="waiting")
    JobFactory(finished=True, parent=parent)
    report = reap_pass()
    assert sorted(report.repaired) == sorted([dependent.pk, parent.pk])
    assert states(dependent, parent) == ["pending", "done"]
    assert reap_pass().repaired == []


def test_cancelling_a_job_cascades_to_descendants_and_dependents() -> None:
    parent = JobFactory(claimed=True)
    Job.objects.filter(pk=parent.pk).update(state="waiting")
    running_child = JobFactory(claimed=True, parent=parent)
    pending_child = JobFactory(parent=parent)
    grandchild = JobFactory(parent=pending_child)
    done_child = JobFactory(finished=True, parent=parent)
    downstream = echo.using(depends_on=[parent.pk]).enqueue()

    assert Job.objects.get(pk=parent.pk).cancel() == "cancelled"
    assert states(parent, running_child, pending_child, grandchild, done_child, downstream) == [
        "cancelled",
        "running",
        "cancelled",
        "cancelled",
        "done",
        "cancelled",
    ]
    assert Job.objects.get(pk=running_child.pk).cancel_requested
    assert "ancestor job" in Job.objects.get(pk=grandchild.pk).error
    assert f"upstream job #{parent.pk}" in Job.objects.get(pk=downstream.pk).error


def test_visibility_of_the_graph() -> None:
    root = JobFactory()
    child = JobFactory(parent=root)
    leaf = JobFactory(parent=child)
    assert list(root.children.all()) == [child]
    assert leaf.root == root and root.root == root


@pytest.mark.django_db(transaction=True)
def test_unique_key_under_fifty_concurrent_enqueues_gives_one_row() -> None:
    barrier = threading.Barrier(50)
    ids: list[int] = []
    errors: list[BaseException] = []

    def enqueue() -> None:
        try:
            barrier.wait()
            with transaction.atomic():
                ids.append(echo.using(unique_key="crawl:example.com").enqueue().pk)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=enqueue) for _ in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(ids) == 50 and len(set(ids)) == 1
    assert Job.objects.filter(unique_key="crawl:example.com").count() == 1


def test_a_finished_unique_job_frees_its_key() -> None:
    first = echo.using(unique_key="k").enqueue()
    finish_now(first)
    second = echo.using(unique_key="k").enqueue()
    assert second.pk != first.pk
