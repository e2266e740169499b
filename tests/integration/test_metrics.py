"""The Prometheus endpoint (django_jobs.metrics): every number against a database with known
rows, the counters across a prune, and who may read it."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import Client, override_settings
from prometheus_client.parser import text_string_to_metric_families

from django_jobs import rollups
from django_jobs.models import Job, Queue, Schedule, ScheduleTick
from django_jobs.prune import prune
from tests.factories import AttemptFactory, JobFactory, WorkerFactory

pytestmark = pytest.mark.django_db

TOKEN = "metrics-token-0123456789abcdef"
TOKENS = {"JOBS_METRICS_TOKENS": [TOKEN]}
OUTSIDE = "203.0.113.9"


def db_now() -> datetime:
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        return cursor.fetchone()[0]


def scrape(client: Client | None = None, **headers: Any) -> dict[tuple[str, tuple], float]:
    """The page's samples: (name, sorted labels) -> value."""
    with override_settings(JOBS_METRICS_ALLOWED_IPS=["127.0.0.1/32"]):
        response = (client or Client()).get("/metrics/", **headers)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    samples = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: dict, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def series(samples: dict, name: str) -> dict[tuple, float]:
    return {labels: v for (n, labels), v in samples.items() if n == name}


def ended(at: datetime, *, state: str = "done", seconds: float = 1.0, waited: float = 0.0,
          failed_attempts: int = 0, task: str = "tests.noop") -> Job:  # fmt: skip
    started = at - timedelta(seconds=seconds)
    job = JobFactory(
        finished=True,
        state=state,
        task=task,
        run_after=started - timedelta(seconds=waited),
        started_at=started,
        finished_at=at,
        attempt=failed_attempts + 1,
    )
    for number in range(1, failed_attempts + 1):
        AttemptFactory(
            job=job, number=number, outcome="error", started_at=started - timedelta(seconds=1),
            finished_at=started,
        )  # fmt: skip
    AttemptFactory(
        job=job,
        number=failed_attempts + 1,
        outcome="done" if state == "done" else "error",
        started_at=started,
        finished_at=at,
    )
    return job


@pytest.fixture
def known_rows() -> datetime:
    now = db_now()
    # Unfinished jobs of "default": 2 ready (the oldest 100 s), 1 scheduled, 1 running, 1
    # waiting for a dependency.
    JobFactory(run_after=now - timedelta(seconds=100))
    JobFactory(run_after=now - timedelta(seconds=10))
    JobFactory(run_after=now + timedelta(hours=1))
    JobFactory(claimed=True, worker_id="live-a:1:aaaaaa", started_at=now - timedelta(seconds=5))
    JobFactory(state="waiting")
    # "reports": paused, limited to 3, no jobs. "orphan": a job ready for an hour, no worker.
    Queue.objects.create(name="reports", paused=True, concurrency_limit=3)
    JobFactory(queue="orphan", run_after=now - timedelta(hours=1))
    WorkerFactory(id="live-a:1:aaaaaa", queues=["default"], concurrency=4, last_seen_at=now)
    WorkerFactory(id="live-b:1:bbbbbb", queues=["reports"], concurrency=2, last_seen_at=now)
    WorkerFactory(
        id="gone:1:cccccc", queues=[], concurrency=8, last_seen_at=now - timedelta(hours=1)
    )
    # Finished three days ago (rolled up, then pruned below) and a minute ago (after the
    # rollups' watermark).
    old = now - timedelta(days=3)
    ended(old, seconds=1.5, waited=2.0)
    ended(old, seconds=2.0, waited=4.0)
    ended(old, seconds=40.0)
    ended(old, state="error", seconds=3.0, failed_attempts=1)
    ended(now - timedelta(minutes=1), seconds=0.05)
    ended(now - timedelta(minutes=1), seconds=0.05)
    # A schedule whose last run succeeded, and one that never ran.
    nightly = Schedule.objects.create(
        name="nightly", task="tests.echo", cron="0 3 * * *", source="code",
        next_run_at=now + timedelta(hours=2),
    )  # fmt: skip
    run = ended(now - timedelta(hours=22), task="tests.echo")
    ScheduleTick.objects.create(
        schedule=nightly, fire_at=now - timedelta(hours=22, minutes=1), job_id=run.pk,
        outcome="enqueued",
    )  # fmt: skip
    Schedule.objects.create(
        name="hourly", task="tests.echo", cron="0 * * * *", source="code",
        next_run_at=now - timedelta(minutes=10),
    )  # fmt: skip
    rollups.roll_up()
    return now


def test_every_number_matches_the_known_rows(known_rows: datetime) -> None:
    now = known_rows
    s = scrape()
    assert value(s, "django_jobs_jobs", queue="default", state="pending") == 3
    assert value(s, "django_jobs_jobs", queue="default", state="running") == 1
    assert value(s, "django_jobs_jobs", queue="default", state="waiting") == 1
    assert value(s, "django_jobs_ready_jobs", queue="default") == 2
    assert value(s, "django_jobs_scheduled_jobs", queue="default") == 1
    assert value(s, "django_jobs_oldest_ready_job_age_seconds", queue="default") == pytest.approx(
        100
    )
    assert value(s, "django_jobs_oldest_ready_job_age_seconds", queue="orphan") == pytest.approx(
        3600
    )
    assert value(s, "django_jobs_oldest_ready_job_age_seconds", queue="reports") == 0
    assert series(s, "django_jobs_live_workers") == {
        (("queue", "default"),): 1,
        (("queue", "orphan"),): 0,
        (("queue", "reports"),): 1,
    }
    assert value(s, "django_jobs_queue_paused", queue="reports") == 1
    assert value(s, "django_jobs_queue_paused", queue="default") == 0
    assert series(s, "django_jobs_queue_concurrency_limit") == {(("queue", "reports"),): 3}
    assert value(s, "django_jobs_workers", status="live") == 2
    assert value(s, "django_jobs_workers", status="silent") == 1
    assert value(s, "django_jobs_worker_slots", status="live") == 6
    assert value(s, "django_jobs_worker_running_jobs", status="live") == 1

    noop = {"queue": "default", "task": "tests.noop"}
    assert value(s, "django_jobs_jobs_finished_total", **noop, outcome="done") == 5
    assert value(s, "django_jobs_jobs_finished_total", **noop, outcome="error") == 1
    assert value(s, "django_jobs_attempts_total", **noop, outcome="done") == 5
    assert value(s, "django_jobs_attempts_total", **noop, outcome="error") == 2
    echo = {"queue": "default", "task": "tests.echo", "outcome": "done"}
    assert value(s, "django_jobs_jobs_finished_total", **echo) == 1
    done = noop
    assert value(s, "django_jobs_attempt_seconds_total", **noop, outcome="done") == (
        pytest.approx(43.6)
    )
    assert value(s, "django_jobs_attempt_seconds_total", **noop, outcome="error") == (
        pytest.approx(4.0)
    )
    assert value(s, "django_jobs_attempt_duration_seconds_count", **done) == 5
    assert value(s, "django_jobs_attempt_duration_seconds_sum", **done) == pytest.approx(43.6)
    assert value(s, "django_jobs_attempt_duration_seconds_bucket", **done, le="0.1") == 2
    assert value(s, "django_jobs_attempt_duration_seconds_bucket", **done, le="1.0") == 2
    assert value(s, "django_jobs_attempt_duration_seconds_bucket", **done, le="2.5") == 4
    assert value(s, "django_jobs_attempt_duration_seconds_bucket", **done, le="30.0") == 4
    assert value(s, "django_jobs_attempt_duration_seconds_bucket", **done, le="60.0") == 5
    assert value(s, "django_jobs_attempt_duration_seconds_bucket", **done, le="+Inf") == 5
    assert value(s, "django_jobs_job_wait_seconds_count", **noop, outcome="done") == 5
    assert value(s, "django_jobs_job_wait_seconds_sum", **noop, outcome="done") == (
        pytest.approx(6.0)
    )

    nightly = {"schedule": "nightly", "task": "tests.echo"}
    assert value(s, "django_jobs_schedule_last_success_timestamp_seconds", **nightly) == (
        pytest.approx((now - timedelta(hours=22)).timestamp())
    )
    assert value(s, "django_jobs_schedule_late_seconds", **nightly) == 0
    hourly = {"schedule": "hourly", "task": "tests.echo"}
    assert (
        "django_jobs_schedule_last_success_timestamp_seconds",
        tuple(sorted(hourly.items())),
    ) not in s
    assert value(s, "django_jobs_schedule_late_seconds", **hourly) == pytest.approx(600)
    assert value(s, "django_jobs_schedule_next_run_timestamp_seconds", **hourly) == (
        pytest.approx((now - timedelta(minutes=10)).timestamp())
    )

    with connection.cursor() as cursor:
        cursor.execute("SELECT kind, subject, severity FROM django_jobs_alerts")
        alerts = cursor.fetchall()
    assert ("queue_no_worker", "orphan") in {(kind, subject) for kind, subject, _ in alerts}
    assert series(s, "django_jobs_alerts_firing") == {
        (("kind", k), ("severity", sev), ("subject", subj)): 1 for k, subj, sev in alerts
    }
    assert sum(series(s, "django_jobs_firing_alerts").values()) == len(alerts)
    assert value(s, "django_jobs_rollups_lag_seconds") < 3600 + 6 * 60


def test_the_counters_stay_after_a_prune(known_rows: datetime) -> None:
    finished_names = (
        "django_jobs_jobs_finished_total",
        "django_jobs_attempts_total",
        "django_jobs_attempt_duration_seconds_bucket",
        "django_jobs_attempt_duration_seconds_sum",
        "django_jobs_attempt_seconds_total",
        "django_jobs_job_wait_seconds_sum",
    )
    before = scrape()
    result = prune(older_than=timedelta(days=1))
    assert result.jobs == 4
    after = scrape()
    for name in finished_names:
        assert series(after, name) == series(before, name), name


def test_a_prometheus_scraper_may_ask_for_openmetrics(known_rows: datetime) -> None:
    with override_settings(JOBS_METRICS_ALLOWED_IPS=["127.0.0.1"]):
        response = Client().get(
            "/metrics/", HTTP_ACCEPT="application/openmetrics-text; version=1.0.0"
        )
    assert response.status_code == 200
    assert response["Content-Type"].startswith("application/openmetrics-text")
    assert response.content.decode().rstrip().endswith("# EOF")


# ------------------------------------------------------------------------------- access


def get(settings: dict[str, Any], remote: str = "127.0.0.1", **headers: Any) -> Any:
    with override_settings(**settings):
        return Client(REMOTE_ADDR=remote).get("/metrics/", **headers)


@pytest.mark.parametrize(
    ("settings", "remote", "headers", "status"),
    [
        ({"DEBUG": False}, "127.0.0.1", {}, 403),
        ({"DEBUG": True}, "203.0.113.9", {}, 200),
        ({"JOBS_METRICS_ALLOWED_IPS": ["10.0.0.0/8"]}, "10.1.2.3", {}, 200),
        ({"JOBS_METRICS_ALLOWED_IPS": ["10.0.0.0/8"]}, "11.1.2.3", {}, 403),
        ({"JOBS_METRICS_ALLOWED_IPS": ["10.0.0.0/8"]}, "::ffff:10.1.2.3", {}, 200),
        ({"JOBS_METRICS_ALLOWED_IPS": ["fd00::/8"]}, "fd00::1", {}, 200),
        ({"JOBS_METRICS_ALLOWED_IPS": ["10.0.0.0/8"]}, "not an address", {}, 403),
        (TOKENS, OUTSIDE, {}, 401),
        (TOKENS, OUTSIDE, {"HTTP_AUTHORIZATION": f"Bearer {TOKEN}"}, 200),
        (TOKENS, OUTSIDE, {"HTTP_AUTHORIZATION": f"bearer  {TOKEN} "}, 200),
        (TOKENS, OUTSIDE, {"HTTP_AUTHORIZATION": "Bearer wrong"}, 401),
        (TOKENS, OUTSIDE, {"HTTP_AUTHORIZATION": f"Basic {TOKEN}"}, 401),
        (TOKENS, OUTSIDE, {"HTTP_AUTHORIZATION": f"Bearer {TOKEN}x"}, 401),
        (
            {"JOBS_METRICS_TOKENS": [TOKEN], "JOBS_METRICS_ALLOWED_IPS": ["10.0.0.0/8"]},
            "10.0.0.1",
            {},
            200,
        ),
    ],
)  # fmt: skip
def test_who_may_read_the_page(settings, remote, headers, status) -> None:
    response = get({"DEBUG": False, **settings}, remote, **headers)
    assert response.status_code == status, response.content
    if status != 200:
        body = response.json()
        assert body["error"] and body["field"]
    if status == 401:
        assert response["WWW-Authenticate"].startswith("Bearer")


def test_only_get_and_head_are_served_and_other_methods_get_json() -> None:
    with override_settings(JOBS_METRICS_ALLOWED_IPS=["127.0.0.1"]):
        client = Client(enforce_csrf_checks=True)
        for method in ("post", "put", "delete", "patch", "options"):
            response = getattr(client, method)("/metrics/", data="x", content_type="text/plain")
            assert response.status_code == 405, method
            assert response.json()["field"] == "method" and response["Allow"] == "GET, HEAD"
        assert Client().head("/metrics/").status_code == 200


@pytest.mark.parametrize(
    "accept",
    [
        "text/plain; version=abc",
        "application/openmetrics-text; version=1.a",
        "application/openmetrics-text; version=",
        "*/*;q=nonsense",
    ],
)
def test_an_accept_header_the_client_library_cannot_read_gets_the_text_format(accept) -> None:
    with override_settings(JOBS_METRICS_ALLOWED_IPS=["127.0.0.1"]):
        response = Client().get("/metrics/", HTTP_ACCEPT=accept)
    assert response.status_code == 200
    assert response["Content-Type"].startswith(("text/plain", "application/openmetrics-text"))


def test_bad_settings_at_run_time_are_a_json_error_that_says_so() -> None:
    with override_settings(JOBS_METRICS_ALLOWED_IPS=["prometheus.internal"]):
        response = Client().get("/metrics/")
    assert response.status_code == 500
    assert "JOBS_METRICS_ALLOWED_IPS" in response.json()["error"]


def test_the_refusal_comes_before_any_read(django_assert_num_queries) -> None:
    with django_assert_num_queries(0):
        assert get({"DEBUG": False}).status_code == 403
        assert get({"JOBS_METRICS_TOKENS": [TOKEN]}, "198.51.100.1").status_code == 401


@pytest.mark.parametrize(
    ("setting", "value", "message"),
    [
        ("JOBS_METRICS_ALLOWED_IPS", "10.0.0.0/8", "a list"),
        ("JOBS_METRICS_ALLOWED_IPS", ["10.0.0.0/33"], "not an address or a CIDR"),
        ("JOBS_METRICS_ALLOWED_IPS", ["prometheus"], "not an address or a CIDR"),
        ("JOBS_METRICS_TOKENS", "secret", "a list"),
        ("JOBS_METRICS_TOKENS", ["short"], "at least 16"),
        ("JOBS_METRICS_TOKENS", [None], "at least 16"),
        ("JOBS_METRICS_TOKENS", ["ünïcode-token-that-never-matches"], "printable ASCII"),
        ("JOBS_METRICS_TOKENS", ["a token with spaces inside it"], "printable ASCII"),
    ],
)
def test_bad_metrics_settings_are_system_check_errors(settings, setting, value, message) -> None:
    from django_jobs.checks import check_metrics

    setattr(settings, setting, value)
    (error,) = check_metrics()
    assert error.id == "django_jobs.E009" and message in error.msg and setting in error.msg


def test_the_shipped_alert_rules_name_metrics_and_labels_the_page_serves(
    known_rows: datetime,
) -> None:
    from tests.unit.helpers import prometheus_rules, selectors

    served: dict[str, set[str]] = {}
    for (name, labels), _ in scrape().items():
        served.setdefault(name, set()).update(label for label, _ in labels)
    for rule in prometheus_rules():
        for name, matchers in selectors(rule["expr"]):
            assert name in served, (rule["alert"], name)
            assert set(matchers) <= served[name], (rule["alert"], matchers)


def counters() -> dict[tuple[str, tuple], float]:
    from django_jobs.metrics import collect

    found = {}
    for family in collect.read():
        if family.type in ("counter", "histogram", "summary"):
            for sample in family.samples:
                found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def test_no_counter_goes_back_when_a_pass_moves_hours_into_the_totals() -> None:
    from django_jobs.models import RollupState

    now = db_now()
    for i in range(240):  # 10 per hour over 24 hours, with durations no float sums exactly
        ended(now - timedelta(hours=1 + i // 10, minutes=i % 10 * 5), seconds=(i % 7 + 1) / 3,
              waited=(i % 5) / 7)  # fmt: skip
    hour = now.replace(minute=0, second=0, microsecond=0)
    RollupState.objects.create(id=1, rolled_until=hour - timedelta(hours=30))
    before = counters()
    passes = 0
    with connection.cursor() as cursor:
        while rollups.roll_up_once(cursor, timedelta(hours=1)) is not None:
            passes += 1
            after = counters()
            went_back = {k: (before[k], v) for k, v in after.items() if v < before.get(k, 0)}
            assert went_back == {}, f"pass {passes}: {went_back}"
            assert after == pytest.approx(before)
            before = after
    assert passes >= 24
