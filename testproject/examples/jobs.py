"""Example jobs of the demo: a slow report, a flaky import and a computation with a result."""

from __future__ import annotations

import hashlib
import random
import time

from django_jobs import job


@job(queue="reports", timeout=120, max_attempts=2)
def build_report(report_id: int, pages: int = 3, seconds_per_page: float = 0.5) -> dict:
    """Render a report page by page; takes a few seconds."""
    for _ in range(pages):
        time.sleep(seconds_per_page)
    return {"report_id": report_id, "pages": pages, "url": f"/reports/{report_id}.pdf"}


@job(queue="imports", max_attempts=4, retry_backoff=(0.5, 2.0))
def import_feed(feed: str, failure_rate: float = 0.4) -> dict:
    """Import a remote feed that fails now and then; retried with backoff."""
    time.sleep(0.2)
    if random.random() < failure_rate:
        raise ConnectionError(f"feed {feed} timed out (simulated)")
    return {"feed": feed, "items": random.randint(10, 500)}


@job
def checksum(text: str, rounds: int = 20000) -> str:
    """Hash a text many times: a CPU-bound job with a result."""
    digest = text.encode()
    for _ in range(rounds):
        digest = hashlib.sha256(digest).digest()
    return digest.hex()
