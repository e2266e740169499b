"""Retention settings and durations, as prunejobs reads them: no database."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test.utils import override_settings

from django_jobs import conf


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ({"older_than": "a fortnight"}, "expected a duration"),
        ({"states": ["pending"]}, "finished states only"),
        ({"keep": "everything"}, "unknown keys"),
    ],
)
def test_a_wrong_jobs_retention_says_what_to_fix(setting, message) -> None:
    with (
        override_settings(JOBS_RETENTION=setting),
        pytest.raises(ImproperlyConfigured, match=message),
    ):
        conf.retention()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("90s", timedelta(seconds=90)),
        ("15m", timedelta(minutes=15)),
        ("1.5h", timedelta(hours=1.5)),
        ("14d", timedelta(days=14)),
        ("2w", timedelta(weeks=2)),
        ("3600", timedelta(hours=1)),
    ],
)
def test_durations_read_like_people_write_them(text, expected) -> None:
    assert conf.parse_duration(text) == expected
