"""The suite's rule on skips: in CI (``CI`` set) every test runs, and a skip is a failure, unless
what the test needs cannot exist on this machine (another operating system, say). Such a test
skips through :func:`not_on_this_machine`, and the run's summary lists it with its reason.

A pytest plugin of its own (``pytest_plugins`` in tests/conftest.py), so that its own test can
load it into a suite of a few lines.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any, NoReturn

import pytest

#: The start of a skip's reason that CI accepts: what the test needs cannot exist on this machine
#: (another operating system, say). Every other skip fails a CI run (``CI`` set).
NOT_ON_THIS_MACHINE = "cannot exist on this machine: "


def not_on_this_machine(what: str) -> NoReturn:
    """Skip this test because ``what`` it needs cannot exist on this machine; CI accepts this
    skip, and prints its reason in the run's summary."""
    pytest.skip(NOT_ON_THIS_MACHINE + what)


def _skip_reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """In CI a skip is a failure, unless its reason says that what it needs cannot exist on
    this machine (:func:`not_on_this_machine`)."""
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if not (os.environ.get("CI") and report.skipped) or hasattr(report, "wasxfail"):
        return
    reason = _skip_reason(report)
    if reason.startswith(NOT_ON_THIS_MACHINE):
        return
    report.outcome = "failed"
    report.longrepr = (
        f"skipped in CI, where every test runs: {reason}\n(a test may skip in CI only through "
        "tests.skips.not_on_this_machine(), for what cannot exist on this machine)"
    )


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Say which tests CI let skip, and why."""
    skipped = [r for r in terminalreporter.stats.get("skipped", []) if not hasattr(r, "wasxfail")]
    if not skipped:
        return
    terminalreporter.section("skipped, and why")
    for report in skipped:
        terminalreporter.line(f"{report.nodeid}: {_skip_reason(report)}")
