#!/usr/bin/env python3
"""The one command that runs the benchmark suite from a fresh checkout:

    python3 bench/run.py [ARGS]         # ARGS go to ``python -m bench`` (see bench/README.md)

It creates ``.venv-bench`` with the running Python and installs the project with its ``dev``
and ``bench`` extras (django-jobs plus the peers: Procrastinate, django-tasks-db, PgQueuer),
again only when pyproject.toml changes, then runs the suite in it. The server is the one of
``DATABASE_URL`` (default: postgres://postgres@127.0.0.1:5432/postgres).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = Path(os.environ.get("DJANGO_JOBS_BENCH_VENV", ROOT / ".venv-bench"))


def ensure_venv() -> Path:
    python = VENV / "bin" / "python"
    if not python.exists():
        print(f"==> creating {VENV}", flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)
    stamp = VENV / ".django-jobs-bench-installed"
    wanted = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    if not (stamp.exists() and stamp.read_text() == wanted):
        print("==> installing django-jobs with the benchmark peers", flush=True)
        subprocess.run(
            [
                str(python),
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "-e",
                f"{ROOT}[dev,bench]",
            ],
            check=True,
        )
        stamp.write_text(wanted)
    return python


def main() -> int:
    if sys.version_info < (3, 11):  # noqa: UP036 - this script must explain itself on old Pythons
        sys.exit("the benchmark suite needs Python 3.11 or newer")
    python = ensure_venv()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [str(python), "-m", "bench", *sys.argv[1:]], cwd=ROOT, env=env, check=False
    ).returncode


if __name__ == "__main__":
    sys.exit(main())
