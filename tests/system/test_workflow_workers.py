"""Dependencies, child jobs with fan-in and failures, run by real workers."""

from __future__ import annotations

import itertools
import time

import pytest
from django.db import connection

from django_jobs.models import Job
from testproject.testjobs.jobs import echo, fan_out, record, tree
from testproject.testjobs.models import Execution
from tests.factories import JobFactory


def states(*jobs: Job) -> list[str]:
    return [Job.objects.get(pk=j.pk).state for j in jobs]


FINALIZATIONS = """
CREATE TABLE IF NOT EXISTS test_finalizations (job_id bigint, state text);
CREATE OR REPLACE FUNCTION test_count_finalization() RETURNS trigger AS $$
BEGIN
    INSERT INTO test_finalizations VALUES (NEW.id, NEW.state);
    RETURN NEW;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER test_count_finalization AFTER UPDATE ON django_jobs_job
FOR EACH ROW WHEN (OLD.state = 'waiting' AND NEW.state IN ('done', 'error', 'cancelled'))
EXECUTE FUNCTION test_count_finalization();
"""


@pytest.fixture
def count_finalizations(transactional_db):
    with connection.cursor() as cursor:
        cursor.execute(FINALIZATIONS)
    yield
    with connection.cursor() as cursor:
        cursor.execute("DROP TRIGGER test_count_finalization ON django_jobs_job")
        cursor.execute("DROP TABLE test_finalizations")


def finalizations(job_id: int) -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM test_finalizations WHERE job_id = %s", [job_id])
        return cursor.fetchone()[0]


@pytest.mark.django_db(transaction=True)
def test_a_diamond_runs_in_dependency_order(start_worker) -> None:
    a = record.enqueue(note="a")
    b = record.using(depends_on=[a]).enqueue(note="b", seconds=0.3)
    c = record.using(depends_on=[a]).enqueue(note="c", seconds=0.3)
    d = record.using(depends_on=[b, c]).enqueue(note="d")
    worker = start_worker("--burst", "--concurrency", "2")
    assert worker.wait() == 0, worker.output
    assert states(a, b, c, d) == ["done"] * 4
    span = {j.note: Job.objects.get(pk=j.job_id) for j in Execution.objects.all()}
    assert span["a"].finished_at <= min(span["b"].started_at, span["c"].started_at)
    assert max(span["b"].finished_at, span["c"].finished_at) <= span["d"].started_at


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_thousand_children_on_eight_slots_finalize_the_parent_exactly_once(
    start_worker, count_finalizations
) -> None:
    parent = fan_out.enqueue(1000)
    after = record.using(depends_on=[parent]).enqueue(note="after the whole tree")
    started = time.monotonic()
    workers = [start_worker("--burst", "--concurrency", "4") for _ in range(2)]
    for worker in workers:
        assert worker.wait(timeout=300) == 0, worker.output
    elapsed = time.monotonic() - started
    parent.refresh_from_db()
    assert parent.state == "done" and parent.result == 1000
    assert parent.children.filter(state="done").count() == 1000
    assert finalizations(parent.pk) == 1
    last_child = parent.children.latest("finished_at").finished_at
    assert parent.finished_at >= last_child
    after.refresh_from_db()
    assert after.state == "done" and after.started_at >= parent.finished_at
    print(
        f"\nfan-in: 1000 children, 2 workers x 4 slots, parent finalizations = "
        f"{finalizations(parent.pk)}, drained in {elapsed:.1f}s"
    )


@pytest.mark.django_db(transaction=True)
def test_children_five_levels_deep_finish_bottom_up(start_worker, count_finalizations) -> None:
    root = tree.enqueue(5)
    worker = start_worker("--burst", "--concurrency", "2")
    assert worker.wait(timeout=120) == 0, worker.output
    root.refresh_from_db()
    assert root.state == "done" and root.result == 5
    levels = [root]
    while levels[-1].children.filter(task="tests.tree").exists():
        levels.append(levels[-1].children.get(task="tests.tree"))
    assert len(levels) == 6  # depths 5..0
    for upper, lower in itertools.pairwise(levels):
        assert upper.state == "done" and upper.finished_at >= lower.finished_at
    assert [finalizations(j.pk) for j in levels[:-1]] == [1] * 5
    assert levels[-1].root == root


@pytest.mark.django_db(transaction=True)
def test_a_child_failure_fails_the_parent_and_its_dependents(start_worker) -> None:
    parent = fan_out.enqueue(2)
    worker = start_worker("--burst")
    assert worker.wait(timeout=60) == 0, worker.output
    assert states(parent) == ["done"]

    failing_parent = JobFactory(claimed=True, task="tests.fan_out")
    Job.objects.filter(pk=failing_parent.pk).update(state="waiting")
    child = JobFactory(parent=failing_parent, task="tests.fail", max_attempts=1)
    downstream = echo.using(depends_on=[failing_parent.pk]).enqueue()
    worker = start_worker("--burst")
    assert worker.wait(timeout=60) == 0, worker.output
    assert states(child, failing_parent, downstream) == ["error", "error", "cancelled"]
    assert Job.objects.get(pk=failing_parent.pk).error == f"child job #{child.pk} ended in error"
