"""Example jobs of the demo: a slow report, a flaky import, a computation with a result, and a
catalog sync that reports its progress and logs as it goes."""

from __future__ import annotations

import hashlib
import logging
import random
import time

from django_jobs import job
from django_jobs.context import JobContext

logger = logging.getLogger(__name__)


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


@job(queue="imports", takes_context=True, timeout=600)
def sync_catalog(context: JobContext, items: int = 200, seconds_per_item: float = 0.01) -> dict:
    """Sync a catalog item by item, reporting progress and logging as it goes."""
    logger.info("syncing %d items with api_key=demo-secret-key", items)
    for done in range(1, items + 1):
        time.sleep(seconds_per_item)
        context.progress(done, items, f"item {done}")
        if done % 50 == 0:
            print(f"synced {done}/{items} items")
    logger.warning("3 items had no price; kept their old one")
    return {"items": items}
