"""Fixtures shared by the suite, and its tiers. Everything outside tests/unit/ runs against a real
PostgreSQL server."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import httpx
import psycopg
import pytest
from django.db import connection

from support import pgbouncer as pgbouncer_launcher

ROOT = Path(__file__).resolve().parent.parent

# In CI a skip fails, unless what the test needs cannot exist on this machine.
pytest_plugins = ["tests.skips", "pytester"]

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"

#: The tests that use these fixtures run a program from a Debian package: fixture -> (package,
#: is its program installed). ``scripts/dev.py test`` installs the packages where it can (as
#: root, with apt-get); elsewhere those tests are skipped, and the run says so once, up front.
NEEDS_DEBIAN_PACKAGE = {
    "pgbouncer": ("pgbouncer", pgbouncer_launcher.installed),
    "browser": ("chromium", lambda: Path(CHROMIUM).exists()),
    "curl": ("curl", lambda: shutil.which("curl") is not None),
    "jq": ("jq", lambda: shutil.which("jq") is not None),
}


def not_installed(items: list[pytest.Item]) -> dict[str, list[pytest.Item]]:
    """The packages missing for some of ``items``, each with the items that need it."""
    missing = {}
    for fixture, (package, installed) in NEEDS_DEBIAN_PACKAGE.items():
        needing = [item for item in items if fixture in getattr(item, "fixturenames", ())]
        if needing and not installed():
            missing[package] = needing
    return missing


def install_command(packages: list[str]) -> str:
    return ("" if os.geteuid() == 0 else "sudo ") + "apt-get install " + " ".join(packages)


#: The tiers, by folder: ``unit`` needs no database at all, ``integration`` runs in-process
#: against PostgreSQL, ``system`` starts worker processes, servers and clusters. A test outside
#: these folders would count as integration. ``scripts/dev.py test unit`` (or integration,
#: system) runs one.
TIERS = ("unit", "integration", "system")

#: What a unit test may not use: pytest-django's database fixtures (and its django_db mark).
DATABASE_FIXTURES = {"db", "transactional_db", "django_db_setup", "live_server", "admin_user"}


def tier(item: pytest.Item) -> str:
    tests = ROOT / "tests"
    parts = item.path.relative_to(tests).parts if item.path.is_relative_to(tests) else ()
    return parts[0] if parts and parts[0] in TIERS else "integration"


#: Tiers whose every test runs Django's own code in-process, and so depends on its version.
DJANGO_VERSION_TIERS = {"unit", "integration"}


def mark_tiers(items: list[pytest.Item]) -> None:
    """Mark each test with its tier, and with ``django_version`` where it depends on Django's
    version (see :data:`DJANGO_VERSION_TIERS`; a browser test drives Django's admin; a system test
    says so with the mark); refuse a unit test that asks for the database."""
    for item in items:
        name = tier(item)
        item.add_marker(name)
        if "browser" in getattr(item, "fixturenames", ()):
            item.add_marker("browser")
        if name in DJANGO_VERSION_TIERS or item.get_closest_marker("browser"):
            item.add_marker("django_version")
        if name == "unit" and (
            item.get_closest_marker("django_db")
            or DATABASE_FIXTURES & set(getattr(item, "fixturenames", ()))
        ):
            raise pytest.UsageError(
                f"{item.nodeid} uses the database: move it out of tests/unit/ (the unit tier "
                "runs without PostgreSQL)"
            )


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--serial",
        choices=("with", "without", "only"),
        default="with",
        help="with (the default), without or only the tests marked serial: scripts/dev.py test "
        "runs the rest on every core (-n), then the serial ones alone",
    )


def select_serial(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep the tests that ``--serial`` asks for; deselect the others."""
    choice = config.getoption("serial")
    if choice == "with":
        return
    wanted = choice == "only"
    kept = [item for item in items if bool(item.get_closest_marker("serial")) == wanted]
    dropped = [item for item in items if bool(item.get_closest_marker("serial")) != wanted]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    mark_tiers(items)
    select_serial(config, items)
    skip_what_is_not_installed(items)
    if os.environ.get("PYTEST_XDIST_WORKER"):
        slow_first(items, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))


#: The order of the tiers under ``-n``: the slowest first.
TIER_ORDER = {"system": 0, "integration": 1, "unit": 2}


def slow_first(items: list[pytest.Item], processes: int) -> None:
    """Order the tests for the ``processes`` of ``-n``. ``--dist worksteal`` gives each process
    one contiguous share of this order, and a process that has run its share takes tests from
    the end of another's. So each share starts with its part of the tests marked slow (dealt
    out in turn), then the rest by tier, system tests first: every process starts on long
    tests at once, and none is left holding a long test it has not started."""
    slow = [item for item in items if item.get_closest_marker("slow")]
    rest = sorted(
        (item for item in items if not item.get_closest_marker("slow")),
        key=lambda item: TIER_ORDER.get(tier(item), 1),
    )
    processes = max(1, processes)
    size, extra = divmod(len(items), processes)
    ordered: list[pytest.Item] = []
    for share in range(processes):
        length = size + (share < extra)
        head = slow[share::processes][:length]
        ordered += head
        ordered += [rest.pop(0) for _ in range(min(length - len(head), len(rest)))]
    ordered += rest + [item for item in slow if item not in ordered]
    items[:] = ordered


def skip_what_is_not_installed(items: list[pytest.Item]) -> None:
    """Skip the tests whose Debian package is missing, saying which; in CI, refuse to run."""
    missing = not_installed(items)
    if not missing:
        return
    if os.environ.get("CI"):
        command = install_command(list(missing))
        raise pytest.UsageError(f"CI runs every test; install what some need: {command}")
    for package, needing in missing.items():
        reason = f"{package} is not installed: {install_command([package])}"
        for item in needing:
            item.add_marker(pytest.mark.skip(reason=reason))


def pytest_report_collectionfinish(items: list[pytest.Item]) -> list[str]:
    missing = not_installed(items)
    if not missing:
        return []
    count = len({item.nodeid for needing in missing.values() for item in needing})
    tests = "1 test that needs" if count == 1 else f"{count} tests that need"
    return [f"skipping {tests} {' or '.join(missing)}: {install_command(list(missing))}"]


def pytest_report_header() -> str:
    import django

    from django_jobs.compat import TASKS_MODULE

    return (
        f"django-jobs matrix leg: Python {sys.version.split()[0]}, Django {django.get_version()}, "
        f"Tasks framework from {TASKS_MODULE}"
    )


def database_url() -> str:
    """The URL of the database the tests use (pytest-django's test database)."""
    s = connection.settings_dict
    user = quote(s.get("USER") or "", safe="")
    password = quote(s.get("PASSWORD") or "", safe="")
    auth = f"{user}:{password}@" if password else (f"{user}@" if user else "")
    host = quote(s.get("HOST") or "", safe="")
    port = f":{s['PORT']}" if s.get("PORT") else ""
    options = {k: v for k, v in s.get("OPTIONS", {}).items() if isinstance(v, str | int)}
    query = "?" + urlencode(options) if options else ""
    return f"postgres://{auth}{host}{port}/{s['NAME']}{query}"


def connect(**kwargs: Any) -> psycopg.Connection[Any]:
    """A separate, plain psycopg connection to the test database (autocommit)."""
    params = dict(connection.get_connection_params())
    params.pop("cursor_factory", None)
    params.pop("context", None)
    return psycopg.connect(**params, autocommit=True, **kwargs)


class WorkerProcess:
    """A ``manage.py runjobworker`` subprocess on the test database."""

    def __init__(self, args: list[str], env: dict[str, str], name: str) -> None:
        self.name = name
        self.args = args
        self.proc = subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), "runjobworker", "--worker-id", name, *args],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self._output: str | None = None

    def wait(self, timeout: float = 60) -> int:
        try:
            out, _ = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            out, _ = self.proc.communicate()
            self._output = out
            raise AssertionError(f"worker {self.name} did not exit in {timeout}s:\n{out}") from None
        self._output = out
        return self.proc.returncode

    @property
    def output(self) -> str:
        assert self._output is not None, "wait() first"
        return self._output

    def signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def signal_group(self, signum: int) -> None:
        """Signal the supervisor and its executors together."""
        os.killpg(self.proc.pid, signum)

    def kill(self) -> None:
        """SIGKILL the whole process group: supervisor and executors."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)


@pytest.fixture
def worker_env() -> dict[str, str]:
    env = dict(os.environ)
    env["DATABASE_URL"] = database_url()
    env["DJANGO_SETTINGS_MODULE"] = "testproject.settings"
    env["PYTHONUNBUFFERED"] = "1"
    return env


@pytest.fixture
def start_worker(worker_env: dict[str, str]) -> Iterator[Callable[..., WorkerProcess]]:
    """Start ``runjobworker`` subprocesses; any left running are killed at the end."""
    started: list[WorkerProcess] = []

    def start(
        *args: str, name: str | None = None, env: dict[str, str] | None = None
    ) -> WorkerProcess:
        worker = WorkerProcess(
            list(args), {**worker_env, **(env or {})}, name or f"t{uuid.uuid4().hex[:8]}"
        )
        started.append(worker)
        return worker

    yield start
    for worker in started:
        if worker.proc.poll() is None:
            worker.kill()
            worker.proc.communicate()


class ApiServer:
    """``uvicorn testproject.asgi:application`` on the test database, serving the HTTP API on a
    socket this process bound to a port the system chose (so that its port is known, and is
    its own, before it starts: uvicorn gets the socket, with ``--fd``).

    ``stop()`` and then ``start()`` again serve it on the same port: while it is stopped, this
    process keeps the port bound, without listening, so that connections to it are refused, as
    when a server is down, and no other process can take it meanwhile."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.socket: socket.socket | None = self._listen(0)
        self.port = self.socket.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/jobs/api/"
        self._held: socket.socket | None = None
        self.proc: subprocess.Popen[str] | None = None
        self._output: str | None = None

    @staticmethod
    def _listen(port: int) -> socket.socket:
        # SO_REUSEPORT: a socket that only holds the port while the server is stopped, and the
        # listening one of the next start, may be bound to it together.
        return socket.create_server(("127.0.0.1", port), backlog=2048, reuse_port=True)

    def start(self) -> None:
        """Start uvicorn on the port and wait until it answers."""
        assert self.proc is None or self.proc.poll() is not None, "already running"
        if self.socket is None:
            self.socket = self._listen(self.port)
        if self._held is not None:
            self._held.close()
            self._held = None
        fd = self.socket.fileno()
        self.proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "uvicorn", "testproject.asgi:application"),
                *("--fd", str(fd), "--log-level", "warning", "--backlog", "2048"),
            ],
            cwd=ROOT,
            env=self.env,
            pass_fds=(fd,),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self._output = None
        self.ready()

    def ready(self, timeout: float = 60) -> None:
        """Wait until the server answers (a claim without a token: 401); Django's start-up
        takes a while on a busy machine."""

        def answers() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"the API server exited:\n{self.stop()}")
            with contextlib.suppress(httpx.TransportError):
                return httpx.post(self.url + "v1/claim", timeout=5).status_code == 401
            return False

        wait_for(answers, timeout, interval=0.1)

    def stop(self) -> str:
        """SIGTERM it (SIGKILL if it lingers) and refuse connections to its port, which stays
        this server's; its output (printed too, for a failing test to show)."""
        if self._output is None and self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self._output, _ = self.proc.communicate(timeout=15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self._output, _ = self.proc.communicate()
            print(self._output)
        if self.socket is not None:
            if self._held is None:
                self._held = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                self._held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
                self._held.bind(("127.0.0.1", self.port))
            self.socket.close()
            self.socket = None
        return self._output or ""

    def close(self) -> None:
        """Stop it, and give up its port."""
        self.stop()
        if self._held is not None:
            self._held.close()
            self._held = None


@pytest.fixture
def start_api_server(
    transactional_db: None, worker_env: dict[str, str]
) -> Iterator[Callable[..., ApiServer]]:
    """Start the HTTP API in uvicorn on the test database (with ``env`` added to the
    environment); stopped at the end. Its tests are transactional: the server sees what they
    commit."""
    started: list[ApiServer] = []

    def start(env: dict[str, str] | None = None) -> ApiServer:
        server = ApiServer({**worker_env, **(env or {})})
        started.append(server)
        server.start()
        return server

    yield start
    for server in started:
        server.close()


def wait_for(predicate: Callable[[], Any], timeout: float = 30, interval: float = 0.05) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(interval)


@pytest.fixture
def busy_queues(db: None) -> dict[str, Any]:
    """A small but realistic moment of a busy system, relative to now.

    Workers: ``pod-a`` (every queue) and ``pod-b`` (reports) alive, ``pod-c`` silent for ten
    minutes. Queue ``default``: five ready jobs (one ready for 30 minutes), two scheduled, two
    running on pod-a, one running on dead pod-c, one waiting; 20 successful attempts of
    ``tests.echo`` over the last 40 minutes taking 1..20 s, and 4 failed ones (error, crashed,
    timeout, lost), one of which was retried and then succeeded. Queue ``reports``: one job
    running on pod-b past its 60 s timeout, three ready jobs, ten successful ``tests.sleep``
    attempts. Returns the notable rows by name.
    """
    from django.utils import timezone

    from tests.factories import AttemptFactory, JobFactory, WorkerFactory

    now = timezone.now()
    ago = lambda **kw: now - timedelta(**kw)  # noqa: E731
    rows: dict[str, Any] = {
        "pod_a": WorkerFactory(id="pod-a:1:aaaaaa", concurrency=4, last_seen_at=ago(seconds=3)),
        "pod_b": WorkerFactory(
            id="pod-b:1:bbbbbb", queues=["reports"], concurrency=2, last_seen_at=ago(seconds=5)
        ),
        "pod_c": WorkerFactory(id="pod-c:1:cccccc", last_seen_at=ago(minutes=10)),
    }

    for minutes in (1, 2, 3, 4):
        JobFactory(queue="default", run_after=ago(minutes=minutes))
    rows["late"] = JobFactory(queue="default", task="tests.echo", run_after=ago(minutes=30))
    for minutes in (10, 20):
        JobFactory(queue="default", run_after=now + timedelta(minutes=minutes))
    for _ in range(3):
        JobFactory(queue="reports", run_after=ago(minutes=2))
    for seconds in (30, 90):
        job = JobFactory(
            queue="default",
            claimed=True,
            worker_id="pod-a:1:aaaaaa",
            started_at=ago(seconds=seconds),
        )
        AttemptFactory(job=job, worker_id=job.worker_id, started_at=job.started_at)
    rows["orphaned"] = JobFactory(
        queue="default", claimed=True, worker_id="pod-c:1:cccccc", started_at=ago(minutes=12)
    )
    rows["overdue"] = JobFactory(
        queue="reports",
        task="tests.sleep",
        claimed=True,
        timeout=60,
        worker_id="pod-b:1:bbbbbb",
        started_at=ago(minutes=5),
    )
    rows["waiting"] = JobFactory(queue="default", state="waiting")

    def finished(
        queue: str,
        task: str,
        minutes_ago: float,
        seconds: float,
        outcome: str,
        job: Any = None,
        number: int = 1,
    ) -> Any:
        end = ago(minutes=minutes_ago)
        if job is None:
            state = {"done": "done", "cancelled": "cancelled"}.get(outcome, "error")
            job = JobFactory(
                queue=queue,
                task=task,
                finished=True,
                state=state,
                attempt=number,
                started_at=end - timedelta(seconds=seconds),
                finished_at=end,
                error="" if outcome == "done" else f"{outcome}: it broke",
            )
        return AttemptFactory(
            job=job,
            number=number,
            worker_id="pod-a:1:aaaaaa",
            outcome=outcome,
            started_at=end - timedelta(seconds=seconds),
            finished_at=end,
            error="" if outcome == "done" else f"{outcome}: it broke",
        )

    for i in range(20):
        finished("default", "tests.echo", minutes_ago=2 + 2 * i, seconds=i + 1, outcome="done")
    for i in range(10):
        finished("reports", "tests.sleep", minutes_ago=3 + 3 * i, seconds=30, outcome="done")
    for i, outcome in enumerate(("error", "crashed", "timeout")):
        finished("default", "tests.fail", minutes_ago=5 + 10 * i, seconds=2, outcome=outcome)
    retried = finished("default", "tests.echo", minutes_ago=50, seconds=4, outcome="lost").job
    retried.attempt = 2
    retried.state = "done"
    retried.save(update_fields=["attempt", "state"])
    finished(
        "default", "tests.echo", minutes_ago=48, seconds=3, outcome="done", job=retried, number=2
    )
    rows["retried"] = retried
    return rows


@pytest.fixture(autouse=True)
def _unit_tests_start_without_a_connection(
    request: pytest.FixtureRequest, django_db_blocker: Any
) -> None:
    """A unit test starts with no database connection left open by an earlier test of another
    tier: code that closes old connections (an executor's, before a job) would otherwise touch
    the database to ask whether that one is still usable."""
    if request.node.get_closest_marker("unit") is None:
        return
    from django.db import connections

    with django_db_blocker.unblock():
        connections.close_all()


# -- Speed: what every test pays for, cut to what it needs ------------------------------------

#: The hasher of the test settings: a password made by a fixture costs microseconds, not the
#: second of PBKDF2 (Django's documented advice for test suites). Nothing under test hashes a
#: password of its own.
TEST_PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

#: Rows that migrations and the ``post_migrate`` signal make once, and that no test writes:
#: kept across transactional tests, where Django's flush would truncate them and make them all
#: again after every test.
KEPT_TABLES = frozenset({"django_migrations", "django_content_type", "auth_permission"})


def pytest_configure(config: pytest.Config) -> None:
    from django.conf import settings

    settings.PASSWORD_HASHERS = TEST_PASSWORD_HASHERS


def truncate_tables_with_rows(alias: str) -> list[str]:
    """Empty, with one ``TRUNCATE``, the tables of installed models that hold rows (but
    :data:`KEPT_TABLES`); the names of those it emptied.

    This is what a transactional test's teardown does instead of Django's ``flush``: the same
    truncation, without remaking content types and permissions, and without truncating (and so
    rewriting) the many tables that the test left empty. Sequences are not reset, as with
    ``flush(reset_sequences=False)``.
    """
    from django.db import connections

    db = connections[alias]
    tables = sorted(
        set(db.introspection.django_table_names(only_existing=True, include_views=False))
        - KEPT_TABLES
    )
    if not tables:
        return []
    quote = db.ops.quote_name
    probe = " UNION ALL ".join(f"SELECT %s WHERE EXISTS (SELECT 1 FROM {quote(t)})" for t in tables)
    with db.cursor() as cursor:
        cursor.execute(probe, tables)
        full = [row[0] for row in cursor.fetchall()]
        if full:
            # CASCADE: a table that references one of these is emptied with it (it may hold
            # rows only where the referenced one does, as a foreign key requires).
            cursor.execute(f"TRUNCATE {', '.join(quote(t) for t in full)} CASCADE")
    return full


def _truncating_fixture_teardown(self: Any) -> None:
    from django.db import transaction

    for alias in self._databases_names(include_mirrors=False):
        with transaction.atomic(using=alias):
            truncate_tables_with_rows(alias)


def _use_the_truncating_teardown() -> None:
    from django.test import TransactionTestCase

    TransactionTestCase._fixture_teardown = _truncating_fixture_teardown  # type: ignore[method-assign]


_use_the_truncating_teardown()
