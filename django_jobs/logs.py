"""Log output for the job system's commands: readable lines, or one JSON object per line."""

from __future__ import annotations

import json
import logging
import sys
import time
from datetime import UTC, datetime
from typing import Any

# Fields that the worker and reaper attach to their records with ``extra=``. ``event`` names
# what happened to a job: claim, finish, retry, release, lease_lost or reap; ``duration`` is the
# attempt's run time in seconds so far; ``outcome`` is how the attempt ended.
STRUCTURED_FIELDS = (
    "event",
    "job_id",
    "task",
    "queue",
    "attempt",
    "worker_id",
    "duration",
    "outcome",
    "state",
)


class JSONFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            # ISO 8601 in UTC, with milliseconds: what log shippers parse without guessing.
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for field in STRUCTURED_FIELDS:
            if hasattr(record, field):
                entry[field] = getattr(record, field)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class TextFormatter(logging.Formatter):
    """The readable lines: ``%(asctime)s %(levelname)-7s %(message)s``, exactly as
    :class:`logging.Formatter` writes them, but with the date and time to the second formatted
    once per second rather than once per line: a busy worker writes two lines per job."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(message)s")
        # (second, its text): one tuple, replaced whole, so that threads never see half of it.
        self._stamp: tuple[int, str] = (-1, "")

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        if datefmt is not None:
            return super().formatTime(record, datefmt)
        second = int(record.created)
        stamp = self._stamp
        if stamp[0] != second:
            stamp = (second, time.strftime(self.default_time_format, self.converter(second)))
            self._stamp = stamp
        return f"{stamp[1]},{int(record.msecs):03d}"  # as logging's default_msec_format


def configure(level: str = "INFO", fmt: str = "text") -> None:
    """Send ``django_jobs`` logs to stderr, unless the project's LOGGING already handles them."""
    logger = logging.getLogger("django_jobs")
    logger.setLevel(level.upper())
    if logger.handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JSONFormatter())
    else:
        handler.setFormatter(TextFormatter())
    logger.addHandler(handler)
    logger.propagate = False
