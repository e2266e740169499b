#!/usr/bin/env python3
"""One entry point for a fresh checkout: set up, then run the demo or the test suite.

    python3 scripts/dev.py demo         # migrate, enqueue example jobs, run a worker (it also
                                        # fires a periodic job), summarize
    python3 scripts/dev.py test [ARGS]  # the whole test suite (ARGS go to pytest)
    python3 scripts/dev.py test unit    # one tier: unit (no database), integration or system
    python3 scripts/dev.py manage ARGS  # manage.py ARGS on the same database (runserver, shell...)

It creates ``.venv`` with the running Python and installs the project with its test extras
(again only when pyproject.toml changes). The newest Django for that Python is installed: 5.2 LTS
on Python 3.11, 6.x on 3.12 and newer. ``DJANGO_JOBS_VENV`` names another virtualenv directory,
and ``DJANGO_JOBS_DJANGO`` a Django requirement to install instead (e.g. ``django>=6,<7``).

With ``DATABASE_URL`` unset it starts an embedded PostgreSQL in ``.pgdata/`` (from the
``pgserver`` package) and stops it afterwards; with ``DATABASE_URL`` set it uses that server,
creating the database if it does not exist.

For the test suite it installs what the pgbouncer, browser and curl-worker tests run, Debian's
``pgbouncer``, ``chromium``, ``curl`` and ``jq``, where it can (as root, with apt-get); elsewhere
the suite skips those tests and says so in one line, with the command that installs them. It
first stops, by pid, any pgbouncer that an earlier, killed test run of this checkout left behind
(support/pgbouncer.py records them).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
import venv
from pathlib import Path
from urllib.parse import parse_qs, quote, urlsplit

ROOT = Path(__file__).resolve().parent.parent
VENV = Path(os.environ.get("DJANGO_JOBS_VENV", ROOT / ".venv"))
PGDATA = ROOT / ".pgdata"

#: The test tiers, each a folder of tests/: ``test unit`` runs tests/unit/ alone, and so on.
TIERS = ("unit", "integration", "system")

#: What the pgbouncer, browser and curl-worker tests run: Debian package -> the program it installs.
TEST_PROGRAMS = {
    "pgbouncer": "/usr/sbin/pgbouncer",
    "chromium": "/usr/bin/chromium",
    "curl": "/usr/bin/curl",
    "jq": "/usr/bin/jq",
}


def say(message: str) -> None:
    print(f"==> {message}", flush=True)


def venv_python() -> Path:
    return VENV / "bin" / "python"


def ensure_venv() -> None:
    if sys.version_info < (3, 11):  # noqa: UP036 - this script must explain itself on old Pythons
        sys.exit("django-jobs needs Python 3.11 or newer")
    if not venv_python().exists():
        say(f"creating {VENV.relative_to(ROOT) if VENV.is_relative_to(ROOT) else VENV}")
        venv.EnvBuilder(with_pip=True).create(VENV)
    stamp = VENV / ".django-jobs-installed"
    django = os.environ.get("DJANGO_JOBS_DJANGO", "")
    wanted = hashlib.sha256((ROOT / "pyproject.toml").read_bytes() + django.encode()).hexdigest()
    if stamp.exists() and stamp.read_text() == wanted:
        return
    say("installing django-jobs and its test dependencies" + (f" with {django}" if django else ""))
    subprocess.run(
        [
            str(venv_python()),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "-e",
            f"{ROOT}[dev]",
            *([django] if django else []),
        ],
        check=True,
    )
    stamp.write_text(wanted)


def install_test_programs() -> None:
    """Install the Debian packages some tests need, where this can (as root, with apt-get).

    Elsewhere tests/conftest.py skips the tests that need them and prints the command.
    """
    missing = [
        package
        for package, program in TEST_PROGRAMS.items()
        if not (shutil.which(package) or Path(program).exists())
    ]
    if not missing or os.geteuid() != 0 or not shutil.which("apt-get"):
        return
    say(f"installing {' and '.join(missing)} (Debian's) for the tests that run them")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    # A failure leaves them missing: the suite then skips those tests and says why.
    subprocess.run(["apt-get", "update", "-qq"], env=env, check=False)
    subprocess.run(
        ["apt-get", "install", "-y", "-qq", *missing],
        env=env,
        stdout=subprocess.DEVNULL,
        check=False,
    )


def stop_leftover_pgbouncers() -> None:
    """Stop the pgbouncers that killed test runs of this checkout left behind (they would hold
    the test database open): those recorded in .pids/, by pid, and nothing else."""
    sys.path.insert(0, str(ROOT))
    from support import pgbouncer

    for pid in pgbouncer.stop_leftovers():
        say(f"stopped pgbouncer {pid}, left behind by an earlier test run")


class EmbeddedPostgres:
    """A throwaway PostgreSQL in .pgdata, for machines where DATABASE_URL is not set."""

    def __init__(self) -> None:
        self.server = None

    def start(self) -> str:
        try:
            import pgserver
        except ImportError:
            sys.exit(
                "DATABASE_URL is not set and the embedded PostgreSQL (the pgserver package, "
                f"available for Python 3.11 and 3.12) is not installed for Python "
                f"{sys.version_info.major}.{sys.version_info.minor}. Set DATABASE_URL to a "
                "PostgreSQL 13+ server, e.g. postgres://postgres@127.0.0.1:5432/django_jobs"
            )
        say(f"starting an embedded PostgreSQL in {PGDATA.name}/")
        self.server = pgserver.get_server(PGDATA, cleanup_mode="stop")
        # pgserver listens on a socket directory, given as ?host=...; keep that, and name our
        # database in the path (django-environ turns ?host= into OPTIONS["host"]).
        socket_dir = parse_qs(urlsplit(self.server.get_uri()).query)["host"][0]
        # A program that names no server (psql, or a connection string without a host) reaches
        # this one too, and never a system PostgreSQL on the default socket.
        os.environ.update(PGHOST=socket_dir, PGPORT="5432", PGUSER="postgres")
        return f"postgres://postgres@/django_jobs?host={quote(socket_dir)}"

    def stop(self) -> None:
        if self.server is not None:
            self.server.cleanup()


def ensure_database(url: str) -> None:
    """Create the database named by ``url`` if it does not exist."""
    import environ
    import psycopg
    from psycopg import sql

    config = environ.Env.db_url_config(url)
    name = config["NAME"]
    params = {
        "dbname": "postgres",
        "user": config.get("USER") or None,
        "password": config.get("PASSWORD") or None,
        "host": config.get("HOST") or config.get("OPTIONS", {}).get("host") or None,
        "port": config.get("PORT") or None,
        "autocommit": True,
    }
    deadline = time.monotonic() + 30
    while True:
        try:
            conn = psycopg.connect(**{k: v for k, v in params.items() if v is not None})
            break
        except psycopg.OperationalError as exc:
            if time.monotonic() > deadline:
                sys.exit(f"cannot connect to PostgreSQL for {url}: {exc}")
            time.sleep(0.5)
    with conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
        if not exists:
            say(f"creating database {name}")
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def tier_paths(tier: str) -> list[str]:
    """The test paths of a tier (see tests/conftest.py): its folder."""
    return [f"tests/{tier}"]


def pytest_args(extra: list[str]) -> list[str]:
    """``extra`` with a first argument that names a tier replaced by that tier's paths."""
    if extra and extra[0] in TIERS:
        return [*tier_paths(extra[0]), *extra[1:]]
    return extra


def test_workers() -> int:
    """How many pytest processes run the tests side by side: ``DJANGO_JOBS_TEST_WORKERS``, or one
    per core, and at least two (most tests wait on PostgreSQL, a worker process or a clock)."""
    wanted = os.environ.get("DJANGO_JOBS_TEST_WORKERS")
    return int(wanted) if wanted else max(2, os.cpu_count() or 1)


def run_pytest(args: list[str]) -> int:
    return subprocess.run([sys.executable, "-m", "pytest", *args], cwd=ROOT, check=False).returncode


def run_tests(args: list[str]) -> int:
    """The tests that ``args`` select, in two runs: all but the ones marked ``serial`` on
    :func:`test_workers` processes, then the serial ones alone (they time things, load the
    machine, or change what the whole server does). Both runs always happen, unless the first
    failed under ``-x``; the exit code is the first failure's, or 5 when neither ran a test."""
    workers = test_workers()
    if workers <= 1:
        say("running the test suite")
        return run_pytest(args)
    say(f"running the test suite on {workers} processes, but the tests marked serial")
    first = run_pytest(["-n", str(workers), "--dist", "worksteal", "--serial=without", *args])
    if first not in (0, 5) and {"-x", "--exitfirst"} & set(args):
        return first
    say("running the tests marked serial, one at a time")
    second = run_pytest(["--serial=only", *args])
    failures = [code for code in (first, second) if code not in (0, 5)]
    if failures:
        return failures[0]
    return 5 if first == second == 5 else 0


def manage(*args: str) -> None:
    subprocess.run([sys.executable, str(ROOT / "manage.py"), *args], check=True, cwd=ROOT)


def inside(command: str, extra: list[str]) -> int:
    # The unit tier needs no database: start none, create none.
    database = not (command == "test" and extra[:1] == ["unit"])
    embedded = None
    if database and not os.environ.get("DATABASE_URL"):
        embedded = EmbeddedPostgres()
        os.environ["DATABASE_URL"] = embedded.start()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
    try:
        if database:
            ensure_database(os.environ["DATABASE_URL"])
        if command == "demo":
            manage("migrate", "--verbosity", "0")
            manage("rundemo", *extra)
            return 0
        if command == "manage":
            manage("migrate", "--verbosity", "0")
            return subprocess.run(
                [sys.executable, str(ROOT / "manage.py"), *extra], cwd=ROOT, check=False
            ).returncode
        stop_leftover_pgbouncers()
        return run_tests(pytest_args(extra))
    finally:
        if embedded is not None:
            embedded.stop()


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] not in {"demo", "test", "manage", "_inside"}:
        print(__doc__)
        return 2
    if sys.argv[1] == "_inside":
        return inside(sys.argv[2], sys.argv[3:])
    ensure_venv()
    if sys.argv[1] == "test":
        install_test_programs()
    python = str(venv_python())
    return subprocess.run([python, __file__, "_inside", *sys.argv[1:]], check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
