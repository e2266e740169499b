"""The suite's rule on skips (tests/skips.py): in CI a skip fails, unless what the test needs
cannot exist on this machine, and the run lists the skips it let through."""

from __future__ import annotations

import pytest

from tests.conftest import ROOT

SUITE = """
import pytest
from tests.skips import not_on_this_machine

def test_runs():
    pass

def test_skips_for_want_of_a_role():
    pytest.skip("the test database user may not create roles")

@pytest.mark.skipif(True, reason="no openssl")
def test_skips_by_mark():
    pass

def test_needs_another_os():
    not_on_this_machine("Windows named pipes")

@pytest.mark.xfail(reason="a known bug", strict=True)
def test_known_bug():
    assert False
"""


def run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, ci: str | None):
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    pytester.makepyfile(test_suite=SUITE)
    return pytester.runpytest_subprocess("-p", "tests.skips", "-p", "no:django", "-rA")


def test_in_ci_a_skip_fails_unless_its_thing_cannot_exist_here(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = run(pytester, monkeypatch, ci="true")
    result.assert_outcomes(passed=1, failed=1, errors=1, skipped=1, xfailed=1)
    result.stdout.fnmatch_lines(
        [
            "*skipped in CI, where every test runs: no openssl*",
            "*skipped in CI, where every test runs: the test database user may not create roles*",
            "*skipped, and why*",
            "*test_needs_another_os: cannot exist on this machine: Windows named pipes",
        ]
    )


def test_outside_ci_every_skip_is_a_skip_and_listed(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = run(pytester, monkeypatch, ci=None)
    result.assert_outcomes(passed=1, skipped=3, xfailed=1)
    result.stdout.fnmatch_lines(
        ["*skipped, and why*", "*test_skips_for_want_of_a_role: the test database user*"]
    )
