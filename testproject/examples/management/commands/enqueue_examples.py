from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.db import transaction

from testproject.examples.jobs import build_report, checksum, import_feed, sync_catalog


def enqueue_examples(count: int) -> list[int]:
    """Enqueue ``count`` of each example job in one transaction; return their ids."""
    with transaction.atomic():
        reports = build_report.enqueue_many(((i,), {"pages": 2 + i % 3}) for i in range(count))
        feeds = import_feed.enqueue_many(((f"feed-{i}",), {}) for i in range(count))
        sums = checksum.enqueue_many(((f"text-{i}",), {}) for i in range(count))
        catalog = sync_catalog.enqueue()
    return [job.pk for job in (*reports, *feeds, *sums, catalog)]


class Command(BaseCommand):
    help = (
        "Enqueue a batch of the example jobs (a slow report, a flaky import, a checksum) and a "
        "catalog sync that reports progress and logs."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--count", type=int, default=4, help="Jobs of each kind (default 4).")

    def handle(self, *args: Any, **options: Any) -> None:
        ids = enqueue_examples(options["count"])
        self.stdout.write(f"enqueued {len(ids)} jobs: #{ids[0]}..#{ids[-1]}")
