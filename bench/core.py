"""What every part of the suite shares: the server and its bench databases, workloads, worker
processes, CPU accounting and the statistics reported."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import conninfo, sql

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SERVER_URL = "postgres://postgres@127.0.0.1:5432/postgres"


@dataclasses.dataclass(frozen=True)
class Workload:
    """What each benchmark job does: nothing, or sleep a fixed time."""

    key: str
    label: str
    seconds: float


NOOP = Workload("noop", "no-op", 0.0)
SLEEP = Workload("sleep", "10 ms sleep", 0.01)
WORKLOADS = {w.key: w for w in (NOOP, SLEEP)}


@dataclasses.dataclass(frozen=True)
class Server:
    """The PostgreSQL server of ``url``, on which each system gets its own database.

    Databases are named ``prefix + system``; only names that contain ``bench`` are ever
    dropped, so a wrong prefix cannot destroy someone else's database.
    """

    url: str
    prefix: str = "bench_"

    def __post_init__(self) -> None:
        if "bench" not in self.prefix:
            raise ValueError(f"the database prefix must contain 'bench', not {self.prefix!r}")

    def database(self, system: str) -> str:
        return f"{self.prefix}{system}"

    def url_for(self, database: str) -> str:
        parts = urlsplit(self.url)
        return urlunsplit(parts._replace(path=f"/{database}"))

    def connect(self, database: str, **kwargs: Any) -> psycopg.Connection[Any]:
        return psycopg.connect(self.url_for(database), autocommit=True, **kwargs)

    def recreate(self, database: str) -> None:
        self.drop(database)
        with self.connect("postgres") as admin:
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))

    def drop(self, database: str) -> None:
        if not database.startswith(self.prefix):
            raise ValueError(f"refusing to drop {database!r}: not a {self.prefix}* database")
        with self.connect("postgres") as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(database))
            )


def ensure_migrated(url: str, settings_module: str | None = None) -> None:
    """Create the database of ``url`` if it does not exist, and migrate it, with
    ``settings_module`` or else the environment's. For the standalone scripts, which keep their
    database between runs."""
    info = conninfo.conninfo_to_dict(url)
    name = info.pop("dbname")
    with psycopg.connect(conninfo.make_conninfo(**info, dbname="postgres"), autocommit=True) as c:
        if not c.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            c.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    env = {**os.environ, "DATABASE_URL": url}
    if settings_module is not None:
        env["DJANGO_SETTINGS_MODULE"] = settings_module
    subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "migrate", "--verbosity", "0"],
        check=True,
        cwd=ROOT,
        env=env,
    )


# ---------------------------------------------------------------------------- processes


@dataclasses.dataclass
class Process:
    """A child process started by the suite, in its own session so it can be stopped whole."""

    popen: subprocess.Popen[bytes]
    cpu_seconds: float | None = None  # user + system, of it and its waited-for descendants

    @property
    def pid(self) -> int:
        return self.popen.pid

    def running(self) -> bool:
        return self.popen.returncode is None and not self._reap(block=False)

    def _reap(self, *, block: bool) -> bool:
        pid, status, usage = os.wait4(self.pid, 0 if block else os.WNOHANG)
        if pid == 0:
            return False
        self.popen.returncode = os.waitstatus_to_exitcode(status)
        self.cpu_seconds = usage.ru_utime + usage.ru_stime
        return True

    def wait(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self.running():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        return True

    def terminate(self) -> None:
        if self.popen.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGTERM)

    def kill_group(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        if self.popen.returncode is None:
            self._reap(block=True)


def spawn(command: Sequence[str], env: dict[str, str], log: Path) -> Process:
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as out:
        popen = subprocess.Popen(
            list(command),
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return Process(popen)


def stop_all(processes: Sequence[Process], grace: float = 20.0) -> None:
    """SIGTERM each process, give them ``grace`` seconds, then SIGKILL their groups."""
    for process in processes:
        process.terminate()
    deadline = time.monotonic() + grace
    for process in processes:
        process.wait(max(0.0, deadline - time.monotonic()))
    for process in processes:
        if process.running():
            process.kill_group()


def python_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra)
    return env


def run_json(command: Sequence[str], env: dict[str, str], timeout: float = 600) -> Any:
    """Run a helper process that prints one JSON document on its last line of stdout."""
    result = subprocess.run(
        list(command), cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )
    if result.returncode != 0:
        raise RuntimeError(
            f"{' '.join(command)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
        )
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    if not lines:
        raise RuntimeError(f"{' '.join(command)} printed nothing:\n{result.stderr}")
    return json.loads(lines[-1])


def emit(document: Any) -> None:
    """The other end of :func:`run_json`: print the result as the last line of stdout."""
    sys.stdout.write(json.dumps(document) + "\n")
    sys.stdout.flush()


def own_cpu_seconds() -> tuple[float, float]:
    """CPU seconds of this process, and of its waited-for children."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, children.ru_utime + children.ru_stime


def process_cpu_seconds(pid: int) -> float:
    """CPU seconds used so far by a live process on this machine (a PostgreSQL backend, say)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


# ---------------------------------------------------------------------------- statistics


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def percentile(values: Sequence[float], p: float) -> float:
    """The ``p``-th percentile (0..100) by linear interpolation between closest ranks."""
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    rank = (len(ordered) - 1) * p / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclasses.dataclass(frozen=True)
class Rate:
    per_second: float
    jobs: int
    seconds: float
    method: str


def steady_rate(finish_times: Sequence[float], warmup: float, window: float) -> Rate:
    """Jobs finished per second once every worker is up, from the jobs' own finish times.

    The window starts ``warmup`` seconds after the first job finished (so process start-up
    is not counted) and lasts ``window`` seconds. A run that drained its queue before the
    window closed is measured between its 10th and 90th percentile finish instead.
    """
    times = sorted(finish_times)
    if len(times) < 2:
        raise ValueError("fewer than two jobs finished: no rate to measure")
    start = times[0] + warmup
    end = min(start + window, times[-1])
    inside = sum(1 for t in times if start < t <= end)
    if end - start >= window / 2 and inside >= 20:
        return Rate(inside / (end - start), inside, end - start, "window")
    low, high = len(times) // 10, (len(times) * 9) // 10
    span = times[high] - times[low]
    if span <= 0:
        span = times[-1] - times[0]
        low, high = 0, len(times) - 1
    return Rate((high - low) / span, high - low, span, "p10-p90")


@contextlib.contextmanager
def timed() -> Iterator[list[float]]:
    """``with timed() as t: ...`` leaves the elapsed seconds in ``t[0]``."""
    box: list[float] = []
    start = time.perf_counter()
    try:
        yield box
    finally:
        box.append(time.perf_counter() - start)


def django_setup(settings_module: str = "bench.settings") -> None:
    """Configure Django in a helper process (the database comes from ``DATABASE_URL``)."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", settings_module)
    import django

    django.setup()


@dataclasses.dataclass(frozen=True)
class Context:
    """Where a suite run works: its server, its output folder, and the Python it runs."""

    server: Server
    out: Path
    python: str = sys.executable

    def log(self, name: str) -> Path:
        return self.out / "logs" / f"{name}.log"
