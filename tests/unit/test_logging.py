"""The JSON log formatter, without a database."""

from __future__ import annotations

import json
import logging
import sys

from django_jobs.logs import JSONFormatter


def test_the_json_formatter_keeps_only_known_fields_and_exceptions() -> None:
    logger = logging.getLogger("django_jobs.test")
    try:
        raise ValueError("broken")
    except ValueError:
        record = logger.makeRecord(
            "django_jobs.test",
            logging.ERROR,
            __file__,
            1,
            "job %d failed",
            (7,),
            sys.exc_info(),
            extra={"event": "finish", "job_id": 7, "secret": "not logged"},
        )
    entry = json.loads(JSONFormatter().format(record))
    assert entry["message"] == "job 7 failed" and entry["event"] == "finish"
    assert entry["job_id"] == 7 and "secret" not in entry
    assert "ValueError: broken" in entry["exception"]
