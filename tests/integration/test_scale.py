"""What keeps the reaper's pass and the controlled claim flat as the job table grows: each read
stays bounded as the rows it must not walk (waiting dependents, finished children, a paused
queue's backlog) grow. Counted in buffers or rows, which no load on the machine changes."""

from __future__ import annotations

import re

import pytest
from django.db import connection, transaction

from django_jobs import store, workflows
from django_jobs.models import Dependency, Job
from django_jobs.reaper import reap_pass
from django_jobs.store.sql import query
from tests.factories import JobFactory
from tests.integration.helpers import generic_plan, uses_one_of

pytestmark = pytest.mark.django_db

WORKER = "pod-x:1:abcdef"  # the worker of JobFactory(claimed=True)

# Blocks of django-jobs' tables and indexes the current transaction has read, hits and reads.
_BLOCKS_READ = r"""
SELECT coalesce(sum(pg_stat_get_xact_blocks_fetched(c.oid)), 0)::bigint FROM pg_class c
WHERE c.relname LIKE 'django\_jobs\_%' AND c.relkind IN ('r', 'i')
"""


def _pass_buffers() -> int:
    """The buffers one reaper pass reads, in a transaction rolled back afterwards."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(_BLOCKS_READ)
        before = cursor.fetchone()[0]
        report = reap_pass()
        cursor.execute(_BLOCKS_READ)
        after = cursor.fetchone()[0]
        transaction.set_rollback(True)
    assert report.reaped == 0
    return int(after - before)


def _add_waiting_dependents(count: int) -> None:
    """``count`` jobs waiting for a job scheduled for tomorrow: nothing to settle."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            WITH upstream AS (
                INSERT INTO django_jobs_job (task, queue, state, run_after)
                VALUES ('tests.noop', 'default', 'pending', now() + interval '1 day')
                RETURNING id
            ), waiting AS (
                INSERT INTO django_jobs_job (task, queue, state)
                SELECT 'tests.noop', 'default', 'waiting' FROM generate_series(1, %(count)s)
                RETURNING id
            )
            INSERT INTO django_jobs_dependency (job_id, depends_on_id)
            SELECT waiting.id, upstream.id FROM waiting, upstream
            """,
            {"count": count},
        )
        cursor.execute("ANALYZE django_jobs_job")
        cursor.execute("ANALYZE django_jobs_dependency")


def test_a_reaper_pass_reads_a_page_of_waiting_dependents_however_many_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(workflows, "_sweep", workflows._Sweep())
    JobFactory.create_batch(3, claimed=True)  # running jobs of a live worker
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO django_jobs_worker (id, name, host, pid, queues, concurrency,"
            " started_at, last_seen_at, boot_id) VALUES (%s, 'w', 'h', 1, '[]', 1, now(), now(),"
            " '')",
            [WORKER],
        )
    _add_waiting_dependents(2 * workflows.REPAIR_PAGE)
    fewer = _pass_buffers()
    _add_waiting_dependents(6 * workflows.REPAIR_PAGE)
    more = _pass_buffers()
    # Four times the waiting jobs; a pass that read each of them would read about four times
    # the buffers.
    assert more <= 1.5 * fewer, (fewer, more)


def test_the_repair_looks_at_every_waiting_dependent_a_page_a_pass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(workflows, "_sweep", workflows._Sweep())
    _add_waiting_dependents(6)
    # The last of seven waiting jobs depends on a job that is done: a crash left it waiting.
    stuck = JobFactory(state="waiting")
    Dependency.objects.create(job=stuck, depends_on=JobFactory(finished=True))
    with connection.cursor() as cursor:
        assert workflows.repair(cursor, page=3) == []  # the first three
        assert workflows.repair(cursor, page=3) == []  # the next three
        # The last one, then the first two again: the walk goes on from the start.
        assert workflows.repair(cursor, page=3) == [stuck.pk]
    assert Job.objects.get(pk=stuck.pk).state == "pending"
    first = Job.objects.filter(state="waiting").order_by("id").first()
    assert first is not None
    Dependency.objects.filter(job=first).update(depends_on=JobFactory(finished=True))
    with connection.cursor() as cursor:
        assert workflows.repair(cursor, page=3) == []  # the third to the fifth
        # The sixth, and from the start again (each job at most once a pass).
        assert workflows.repair(cursor, page=3) == [first.pk]


def _explain(sql: str, params: dict) -> str:
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql, params)
        return "\n".join(row[0] for row in cursor.fetchall())


def _buffers(plan: str) -> int:
    found = re.search(r"Buffers: shared hit=(\d+)(?: read=(\d+))?", plan)
    assert found is not None, plan
    return int(found.group(1)) + int(found.group(2) or 0)


def test_the_waiting_parents_check_reads_waiting_parents_only() -> None:
    # Most jobs have run (attempt 1), and thousands wait for dependencies (attempt 0): the
    # statistics of attempt alone would make "waiting with attempt > 0" look common.
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO django_jobs_job (task, queue, state, attempt, worker_id, started_at,
                                         finished_at)
            SELECT 'tests.noop', 'default', 'done', 1, 'w', now(), now()
            FROM generate_series(1, 20000)
            """
        )
    _add_waiting_dependents(5000)
    plan = _explain(query("unsettled_parents"), {"limit": 1000})
    assert "job_waiting_parent_idx" in plan, plan
    assert _buffers(plan) <= 10, plan  # not the 5,000 waiting dependents


def test_the_stray_children_check_reads_active_children_only() -> None:
    # Many workflows ran to the end: their children are done, and none can be a stray.
    with connection.cursor() as cursor:
        cursor.execute(
            """
            WITH parents AS (
                INSERT INTO django_jobs_job (task, queue, state, attempt, worker_id, started_at,
                                             finished_at)
                SELECT 'tests.noop', 'default', 'done', 1, 'w', now(), now()
                FROM generate_series(1, 200)
                RETURNING id
            )
            INSERT INTO django_jobs_job (task, queue, state, attempt, worker_id, started_at,
                                         finished_at, parent_id, parent_attempt)
            SELECT 'tests.noop', 'default', 'done', 1, 'w', now(), now(), parents.id, 1
            FROM parents, generate_series(1, 100)
            """
        )
        cursor.execute("ANALYZE django_jobs_job")
    plan = _explain(query("stray_children"), {"limit": 1000})
    assert "job_active_child_idx" in plan, plan
    assert _buffers(plan) <= 10, plan  # not the 20,000 finished children


@pytest.mark.django_db(transaction=True)
def test_a_claim_under_controls_takes_its_queues_job_from_that_queues_part_of_the_index() -> None:
    # Most pending jobs are the open queue's (scheduled for later), and a paused queue's backlog
    # sorts ahead of every one of them: a plan that walked job_claim_free_idx and filtered on
    # the queue would walk that backlog first.
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO django_jobs_job (task, queue, priority, state, run_after)
            SELECT 'tests.noop', 'default', 0, 'pending',
                   now() + CASE WHEN g <= 10 THEN -interval '1 hour' ELSE interval '1 day' END
            FROM generate_series(1, 30000) g
            """
        )
        cursor.execute(
            """
            INSERT INTO django_jobs_job (task, queue, priority, state, run_after)
            SELECT 'tests.noop', 'paused', 5, 'pending', now() - interval '2 hours'
            FROM generate_series(1, 3000)
            """
        )
        cursor.execute("INSERT INTO django_jobs_queue (name, paused) VALUES ('paused', true)")
        cursor.execute("ANALYZE django_jobs_job")
    free_claim = store.claim_branch("claim_free_job")
    params = {"worker_id": WORKER, "queue": "default", "skip_tasks": None}
    with transaction.atomic():
        custom = _explain(free_claim, params)
        transaction.set_rollback(True)
    generic = generic_plan(free_claim, params)
    for plan in (custom, generic):
        assert uses_one_of(("job_claim_free_queue_idx",), plan), plan
        assert "Sort" not in plan and "Rows Removed by Filter" not in plan, plan
    # And the function, with its inner statements: it claims the open queue's job having read
    # a handful of job rows, not the backlog's thousands.
    fetched = (  # rows that index scans of the job table fetched, counted on each index
        "SELECT sum(pg_stat_get_xact_tuples_fetched(indexrelid)) FROM pg_index"
        " WHERE indrelid = 'django_jobs_job'::regclass"
    )
    with transaction.atomic(), connection.cursor() as cursor:
        before = cursor.execute(fetched).fetchone()[0]
        claimed = store.claim(cursor, WORKER, None)
        read = cursor.execute(fetched).fetchone()[0] - before
    assert claimed is not None and Job.objects.get(pk=claimed.id).queue == "default"
    assert read <= 50, read
