"""The django_jobs_queue_demand view, and the query KEDA runs on it in
deploy/kubernetes/keda.yaml, against a real database."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
import yaml
from django.db import connection
from django.utils import timezone

from django_jobs import queues
from django_jobs.models import Job
from tests.conftest import ROOT
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db(transaction=True)


def keda_query() -> str:
    documents = yaml.safe_load_all((ROOT / "deploy" / "kubernetes" / "keda.yaml").read_text())
    (scaled,) = [d for d in documents if d["kind"] == "ScaledObject"]
    return scaled["spec"]["triggers"][0]["metadata"]["query"]


def demand() -> dict[str, dict[str, Any]]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM django_jobs_queue_demand")
        names = [c[0] for c in cursor.description]
        return {row[0]: dict(zip(names, row, strict=True)) for row in cursor.fetchall()}


def scalar(sql: str) -> Any:
    with connection.cursor() as cursor:
        cursor.execute(sql)
        return cursor.fetchone()[0]


def test_demand_counts_running_and_claimable_ready_jobs() -> None:
    now = timezone.now()
    JobFactory.create_batch(3, queue="default")
    JobFactory(queue="default", run_after=now + timedelta(hours=1))  # not ready yet
    JobFactory(queue="default", concurrency_key="customer-1")  # keyed jobs count too
    JobFactory.create_batch(2, queue="default", claimed=True)
    JobFactory(queue="default", state=Job.State.DONE, finished_at=now)  # finished: not counted
    JobFactory.create_batch(5, queue="reports")
    JobFactory.create_batch(4, queue="imports")
    JobFactory(queue="imports", claimed=True)
    JobFactory(queue="later", run_after=now + timedelta(hours=1))
    queues.pause("imports", by="test")
    queues.set_limit("reports", 2)
    rows = demand()
    assert rows["default"] == {
        "queue": "default",
        "ready": 4,
        "running": 2,
        "paused": False,
        "concurrency_limit": None,
        "slots_wanted": 6,
    }
    assert (rows["reports"]["ready"], rows["reports"]["slots_wanted"]) == (5, 2)  # the limit
    assert (rows["imports"]["paused"], rows["imports"]["slots_wanted"]) == (True, 1)  # running
    assert "later" not in rows  # nothing ready or running


def test_the_keda_query_runs_and_scales_to_zero() -> None:
    query = keda_query()
    assert scalar(query) == 0.0  # nothing to do: zero replicas
    JobFactory.create_batch(3, queue="default")
    JobFactory.create_batch(2, queue="reports", claimed=True)
    JobFactory.create_batch(7, queue="not-in-the-query")
    assert scalar(query) == 5.0
