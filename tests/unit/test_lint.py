import importlib.util
import shutil
import subprocess
import sys

import pytest

from tests.conftest import ROOT


@pytest.mark.skipif(
    shutil.which("ruff") is None and not (ROOT / ".venv/bin/ruff").exists(),
    reason="ruff is not installed",
)
def test_ruff_finds_nothing() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "check", str(ROOT)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.skipif(
    importlib.util.find_spec("mypy") is None, reason="mypy is not installed (pip install -e .[dev])"
)
def test_mypy_finds_nothing() -> None:
    # The settings of [tool.mypy] in pyproject.toml: the package, with Django's types.
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-error-summary"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stdout + result.stderr
