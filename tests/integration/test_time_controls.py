"""Time-based controls, driven through the claim: rate limits (a task's, a key's, a queue's),
deadlines, and fair queues; their bad input, their plans, and what the admin and views show."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core import checks
from django.db import connection
from django.test import override_settings
from django.utils import timezone

from django_jobs import queues, workflows
from django_jobs.exceptions import InvalidOption
from django_jobs.models import Job, Queue, RateWindow
from django_jobs.rates import Rate, parse_rate, spell
from testproject.testjobs.jobs import echo, expiring, rated, rated_retry, tenant_import
from tests.factories import JobFactory
from tests.integration.helpers import claim, finish

pytestmark = pytest.mark.django_db(transaction=True)


def age_window(key: str, seconds: float) -> None:
    """Move a key's recorded starts ``seconds`` into the past (and its free_at with them), as
    if that much time had gone by."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE django_jobs_rate SET starts = ARRAY(SELECT s - make_interval(secs => %s)"
            " FROM unnest(starts) AS s ORDER BY s), free_at = free_at - make_interval(secs => %s)"
            " WHERE key = %s",
            [seconds, seconds, key],
        )


# ------------------------------------------------------------------------------ the spelling


@pytest.mark.parametrize(
    ("text", "rate"),
    [
        ("10/s", Rate(10, 1)),
        ("100/m", Rate(100, 60)),
        ("1000/h", Rate(1000, 3600)),
        ("10/2s", Rate(10, 2)),
        ("5/30m", Rate(5, 1800)),
        (" 3 / 1d ", Rate(3, 86400)),
    ],
)
def test_rates_are_read_as_starts_per_window(text: str, rate: Rate) -> None:
    assert parse_rate(text) == rate
    assert parse_rate(spell(rate.limit, rate.period)) == rate


@pytest.mark.parametrize("bad", ["ten/s", "0/s", "5/0s", "5/", "/s", "5/2x", "-1/s", "", 5, None])
def test_a_bad_rate_is_refused_naming_the_option_and_nothing_is_written(bad: object) -> None:
    with pytest.raises(InvalidOption, match="rate_limit"):
        echo.using(rate_limit=bad).enqueue(1) if bad is not None else parse_rate(bad)
    assert not Job.objects.exists()


@pytest.mark.parametrize("bad", [-1, 0, float("nan"), float("inf"), "60", True])
def test_a_bad_expires_after_is_refused(bad: object) -> None:
    with pytest.raises(InvalidOption, match="expires_after"):
        echo.using(expires_after=bad).enqueue(1)
    assert not Job.objects.exists()


def test_an_expires_at_in_the_past_is_refused_by_the_database_clock() -> None:
    with pytest.raises(InvalidOption, match=r"expires_at .* has passed"):
        echo.using(expires_at=timezone.now() - timedelta(seconds=1)).enqueue(1)
    with pytest.raises(InvalidOption, match=r"expires_at .* has passed"):
        echo.using(expires_at=timezone.now() - timedelta(seconds=1)).enqueue_many([((1,), {})])
    with pytest.raises(InvalidOption, match="aware datetime"):
        echo.using(expires_at=timezone.now().replace(tzinfo=None)).enqueue(1)
    assert not Job.objects.exists()


def test_a_rate_key_without_a_rate_limit_is_refused() -> None:
    with pytest.raises(InvalidOption, match="rate_key 'acme' needs a rate limit"):
        echo.using(rate_key="acme").enqueue(1)


# ------------------------------------------------------------------------------- rate limits


def test_a_task_rate_limit_lets_n_starts_in_a_window_and_holds_the_rest_pending() -> None:
    jobs = [rated.enqueue(str(i)) for i in range(12)]
    assert (jobs[0].rate_key, jobs[0].rate_limit, jobs[0].rate_period) == ("tests.rated", 10, 2)
    claimed = [claim() for _ in range(12)]
    assert sum(1 for c in claimed if c is not None) == 10
    held = Job.objects.filter(state="pending")
    assert held.count() == 2
    window = RateWindow.objects.get(key="key:tests.rated")
    assert len(window.starts) == 10 and window.free_at is not None
    # The view says when the next start may happen.
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT kind, name, rate_limit, rate_period, starts_in_window, is_full,"
            " next_start > now() FROM django_jobs_rate_limits"
        )
        assert cursor.fetchall() == [("key", "tests.rated", 10, 2, 10, True, True)]
    # Finishing jobs frees no start: the window counts starts, not running jobs.
    for c in claimed:
        if c is not None:
            finish(c)
    assert claim() is None
    age_window("key:tests.rated", 2.1)
    assert claim() is not None and claim() is not None
    assert claim() is None


def test_jobs_held_by_a_rate_limit_do_not_hold_back_other_ready_work() -> None:
    for i in range(3):
        rated.using(rate_limit="1/h").enqueue(str(i))
    free = echo.enqueue("free")
    first = claim()
    assert first.task == "tests.rated"
    assert claim().id == free.pk  # the held key is passed over, its jobs untouched
    assert claim() is None
    assert Job.objects.filter(state="pending", task="tests.rated").count() == 2


def test_each_rate_key_has_a_window_of_its_own() -> None:
    for key in ("partner:acme", "partner:globex"):
        for i in range(3):
            rated.using(rate_key=key, rate_limit="2/h").enqueue(f"{key}:{i}")
    started = [claim() for _ in range(6)]
    keys = sorted(Job.objects.get(pk=c.id).rate_key for c in started if c is not None)
    assert keys == ["partner:acme", "partner:acme", "partner:globex", "partner:globex"]


def test_a_retry_counts_as_a_start() -> None:
    job = rated_retry.enqueue()
    starts = 0
    for _ in range(3):
        c = claim()
        if c is None:
            break
        starts += 1
        finish(c, "error")  # retried at once (no backoff)
    assert starts == 3  # within "3/2s": the three attempts
    Job.objects.filter(pk=job.pk).update(state="pending", attempt=0, finished_at=None)
    assert claim() is None  # a fourth start in the window is held back


def test_a_queue_rate_limit_from_the_settings_holds_the_queue_and_not_others() -> None:
    with override_settings(JOBS_QUEUE_RATE_LIMITS={"reports": "2/h"}):
        queues.sync_limits()
    row = Queue.objects.get(name="reports")
    assert (row.rate_limit, row.rate_period, row.rate_source) == (2, 3600, "settings")
    for i in range(3):
        echo.using(queue="reports").enqueue(i)
    other = echo.enqueue("default")
    got = [claim() for _ in range(4)]
    assert sorted(c.queue for c in got if c is not None) == ["default", "reports", "reports"]
    assert any(c.id == other.pk for c in got if c is not None)
    # The admin's rate wins over the settings until set back.
    queues.set_rate("reports", "5/h")
    with override_settings(JOBS_QUEUE_RATE_LIMITS={"reports": "2/h"}):
        queues.sync_limits()
    assert Queue.objects.get(name="reports").rate_limit == 5
    assert claim(["reports"]) is not None
    # Gone from the settings: a rate that came from them goes.
    queues.set_rate("reports", None, source="settings")
    assert Queue.objects.get(name="reports").rate_limit is None


def test_a_keyed_job_in_a_rate_limited_queue_counts_against_the_queue() -> None:
    queues.set_rate("imports", "1/h")
    echo.using(queue="imports", concurrency_key="tenant:1").enqueue(1)
    echo.using(queue="imports").enqueue(2)
    assert claim(["imports"]) is not None
    assert claim(["imports"]) is None


# -------------------------------------------------------------------------------- deadlines


def test_a_job_past_its_deadline_is_never_claimed_and_ends_cancelled_as_expired() -> None:
    job = expiring.enqueue("late")
    keyed = expiring.using(concurrency_key="k").enqueue("late too")
    assert job.expires_at is not None
    Job.objects.filter(pk__in=[job.pk, keyed.pk]).update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )
    assert claim() is None
    with connection.cursor() as cursor:
        assert sorted(workflows.expire_due(cursor)) == sorted([job.pk, keyed.pk])
    job.refresh_from_db()
    assert job.state == "cancelled" and job.error.startswith("expired: not started by its deadline")
    assert job.attempts.count() == 0


def test_jobstats_counts_the_jobs_that_expired_unstarted_apart_from_attempts() -> None:
    from io import StringIO

    from django.core.management import call_command

    from django_jobs.store import operations_views

    jobs = [expiring.enqueue(f"late {i}") for i in range(3)]
    Job.objects.filter(pk__in=[j.pk for j in jobs]).update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )
    with connection.cursor() as cursor:
        workflows.expire_due(cursor)
    echo.enqueue(1)
    queue = {q["queue"]: q for q in operations_views.summary(15)["queues"]}[jobs[0].queue]
    assert (queue["expired"], queue["cancelled"], queue["pending"]) == (3, 0, 1)
    out = StringIO()
    call_command("jobstats", stdout=out)
    assert f"\n{jobs[0].queue} ·" in out.getvalue() and " · 3 expired" in out.getvalue()
    # Outside the window they no longer count.
    Job.objects.filter(pk__in=[j.pk for j in jobs]).update(
        finished_at=timezone.now() - timedelta(minutes=20)
    )
    queue = {q["queue"]: q for q in operations_views.summary(15)["queues"]}[jobs[0].queue]
    assert queue["expired"] == 0


def test_dependents_of_an_expired_job_are_cancelled() -> None:
    job = expiring.enqueue("upstream")
    child = echo.using(depends_on=[job]).enqueue("downstream")
    assert child.state == "waiting"
    Job.objects.filter(pk=job.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    with connection.cursor() as cursor:
        workflows.expire_due(cursor)
    child.refresh_from_db()
    assert child.state == "cancelled" and f"#{job.pk}" in child.error


def test_a_retry_whose_backoff_ends_after_the_deadline_does_not_run() -> None:
    job = echo.using(expires_after=60, max_attempts=3).enqueue(1)
    c = claim()
    finish(c, "error")
    job.refresh_from_db()
    assert job.state == "pending"
    Job.objects.filter(pk=job.pk).update(
        run_after=timezone.now() + timedelta(hours=1), expires_at=timezone.now()
    )
    Job.objects.filter(pk=job.pk).update(run_after=timezone.now() - timedelta(seconds=1))
    assert claim() is None
    with connection.cursor() as cursor:
        assert workflows.expire_due(cursor) == [job.pk]


def test_a_job_started_before_its_deadline_is_not_touched_by_the_expiry() -> None:
    job = echo.using(expires_after=60).enqueue(1)
    c = claim()
    Job.objects.filter(pk=job.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    with connection.cursor() as cursor:
        assert workflows.expire_due(cursor) == []
    assert finish(c) is not None
    job.refresh_from_db()
    assert job.state == "done"


def test_expires_after_counts_from_the_database_clock_for_bulk_enqueues_too() -> None:
    jobs = echo.using(expires_after=timedelta(minutes=5)).enqueue_many(
        [((i,), {}) for i in range(3)]
    )
    stored = Job.objects.filter(pk__in=[j.pk for j in jobs])
    deadlines = {j.expires_at for j in stored}
    assert len(deadlines) == 1
    (deadline,) = deadlines
    assert timedelta(minutes=4) < deadline - stored[0].created_at <= timedelta(minutes=5, seconds=1)
    assert jobs[0].expires_at == deadline


def test_the_expiry_plan_reads_the_expiry_index() -> None:
    done = JobFactory(state="done", finished_at=timezone.now())
    with connection.cursor() as cursor:
        # 20,000 finished jobs and 20 pending ones with a deadline: the index holds only those.
        cursor.execute(
            "INSERT INTO django_jobs_job (task, queue, priority, state, args, kwargs, attempt,"
            " max_attempts, run_after, created_at, finished_at, error, cancel_requested,"
            " progress_message, expires_at)"
            " SELECT task, queue, priority, CASE WHEN g <= 20 THEN 'pending' ELSE state END,"
            " args, kwargs, 0, max_attempts, run_after, created_at,"
            " CASE WHEN g <= 20 THEN NULL ELSE finished_at END, error, false, '',"
            " CASE WHEN g <= 20 THEN now() + interval '1 hour' END"
            " FROM django_jobs_job, generate_series(1, 20000) AS g WHERE id = %s",
            [done.pk],
        )
        cursor.execute("ANALYZE django_jobs_job")
        cursor.execute(
            "EXPLAIN SELECT id FROM django_jobs_job WHERE state = 'pending'"
            " AND expires_at IS NOT NULL AND expires_at <= now() ORDER BY expires_at LIMIT 100"
        )
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "job_expiry_idx" in plan


# ------------------------------------------------------------------------------- fair queues


def test_a_fair_queue_takes_keys_round_robin() -> None:
    with override_settings(JOBS_FAIR_QUEUES=["imports"]):
        queues.sync_limits()
    assert Queue.objects.get(name="imports").fair
    for n in range(30):
        tenant_import.using(concurrency_key="tenant:a", concurrency_limit=100).enqueue("a", n)
    for n in range(3):
        tenant_import.using(concurrency_key="tenant:b", concurrency_limit=100).enqueue("b", n)
    order = []
    for _ in range(8):
        c = claim(["imports"])
        order.append(Job.objects.get(pk=c.id).concurrency_key[-1])
    # B's three jobs start within the first six claims: one per claim as long as B has fewer
    # running than A.
    assert order[:6].count("b") == 3, order
    # Without the setting, claim order (A's older jobs first).
    with override_settings(JOBS_FAIR_QUEUES=[]):
        queues.sync_limits()
    assert not Queue.objects.get(name="imports").fair


# ------------------------------------------------------------------------------ system checks


def test_unknown_or_bad_queues_in_the_settings_are_system_check_errors() -> None:
    from django_jobs.checks import check_time_controls

    with override_settings(JOBS_QUEUE_RATE_LIMITS={"nope": "5/s"}, JOBS_FAIR_QUEUES=["nada"]):
        found = check_time_controls()
    assert [(e.id, "nope" in e.msg or "nada" in e.msg) for e in found] == [
        ("django_jobs.E011", True),
        ("django_jobs.E011", True),
    ]
    with override_settings(JOBS_QUEUE_RATE_LIMITS={"default": "ten/s"}):
        (error,) = check_time_controls()
    assert error.id == "django_jobs.E010" and "ten/s" in error.msg
    with override_settings(JOBS_QUEUE_RATE_LIMITS={"reports": "5/m"}, JOBS_FAIR_QUEUES=["imports"]):
        assert check_time_controls() == []
    assert isinstance(found[0], checks.Error)


def test_the_job_page_shows_a_held_jobs_next_start(admin_client) -> None:
    held = [rated.using(rate_limit="1/h").enqueue(str(i)) for i in range(2)]
    assert claim() is not None
    page = admin_client.get(f"/admin/django_jobs/job/{held[1].pk}/change/")
    text = page.content.decode()
    assert page.status_code == 200
    assert "rate 1/h of tests.rated" in text and "held by a rate limit until" in text
    deadline = expiring.enqueue("x")
    text = admin_client.get(f"/admin/django_jobs/job/{deadline.pk}/change/").content.decode()
    assert "expires " in text and "held by" not in text
