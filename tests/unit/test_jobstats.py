"""How jobstats prints ages: no database."""

from __future__ import annotations

import pytest

from django_jobs.store import operations_views as stats


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(None, ""), (0.4, "0s"), (59, "59s"), (252, "4m12s"), (11100, "3h05m"), (187200, "2d04h")],
)
def test_ages_read_like_durations(seconds, text) -> None:
    assert stats.format_age(seconds) == text
