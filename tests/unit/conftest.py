"""Fixtures shared by the unit tests (what they share that is not a fixture is in
``tests/unit/helpers.py``; the fakes a supervisor runs on, in ``tests/unit/fakes.py``)."""

from __future__ import annotations

import time

import pytest

from tests.unit.fakes import Clock


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    """``time.monotonic``, as the worker modules call it, on a clock that only the fake
    executors' waits move forward."""
    fake = Clock()
    monkeypatch.setattr(time, "monotonic", fake)
    return fake
