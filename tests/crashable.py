"""A throwaway PostgreSQL cluster that a test can crash for real.

The cluster runs from the machine's own PostgreSQL binaries (``pg_config --bindir``, or the
newest under ``/usr/lib/postgresql``), else from the ones the ``pgserver`` package ships. It
listens on a Unix socket in a directory of its own, so it never touches the shared server. As
root it runs as the ``postgres`` user (PostgreSQL refuses to run as root).

:meth:`CrashableCluster.crash` is ``kill -9`` of the postmaster and every one of its children,
by pid: what a power loss does to the server's memory. What a crash can lose is what was not yet
written to the operating system. To make that window wide on purpose, the WAL writer waits 10 s
between rounds (``wal_writer_delay``), and :meth:`CrashableCluster.stop_wal_writer` stops it
outright (SIGSTOP), so that an asynchronous commit stays in shared memory until the crash.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg

PORT = 5432


def _bindir() -> Path:
    """Where ``initdb`` and ``postgres`` are."""
    candidates: list[Path] = []
    pg_config = shutil.which("pg_config")
    if pg_config:
        out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=False)
        candidates.append(Path(out.stdout.strip()))
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: p.parent.name)
    candidates.extend(reversed(versions))
    for path in candidates:
        if (path / "initdb").exists() and (path / "postgres").exists():
            return path
    import pgserver  # raises ImportError where there is nothing to run

    bundled = Path(pgserver.__file__).parent / "pginstall" / "bin"
    if (bundled / "initdb").exists():
        return bundled
    raise FileNotFoundError("no PostgreSQL binaries (initdb, postgres) on this machine")


def _run_as() -> dict[str, Any]:
    """``subprocess`` arguments that drop root for PostgreSQL's own programs."""
    if os.geteuid() != 0:
        return {}
    try:
        entry = pwd.getpwnam("postgres")
    except KeyError:
        from pgserver.utils import ensure_user_exists

        ensure_user_exists("pgserver")
        entry = pwd.getpwnam("pgserver")
    return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            # The parent pid is the 4th field, after the command name in parentheses.
            stat = (entry / "stat").read_text()
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


class CrashableCluster:
    """One PostgreSQL cluster in a temporary directory; see the module's docstring."""

    def __init__(self, settings: dict[str, str] | None = None) -> None:
        self.bindir = _bindir()
        self.run_as = _run_as()
        self.root = Path(tempfile.mkdtemp(prefix="django-jobs-crash-"))
        self.data = self.root / "data"
        self.log = self.root / "postgres.log"
        self.settings = {
            "listen_addresses": "",
            "unix_socket_directories": str(self.root),
            "port": str(PORT),
            "max_connections": "60",
            "shared_buffers": "32MB",
            "fsync": "on",
            # The window a crash can hit: the WAL writer flushes at most every 10 s.
            "wal_writer_delay": "10s",
            "wal_writer_flush_after": "0",
            # Nothing else should write WAL on its own while a test watches.
            "autovacuum": "off",
            "checkpoint_timeout": "1h",
            "max_wal_size": "1GB",
            **(settings or {}),
        }
        self.process: subprocess.Popen[bytes] | None = None
        if self.run_as:
            os.chown(self.root, self.run_as["user"], self.run_as["group"])
        # A copy of the one cluster this process made and migrated: initdb and migrate once.
        subprocess.run(["cp", "-a", str(_template()), str(self.data)], check=True)

    # ------------------------------------------------------------------ connections

    def url(self, dbname: str) -> str:
        """A ``DATABASE_URL`` for django-environ."""
        return f"postgres://postgres@/{dbname}?host={self.root}&port={PORT}"

    def connect(self, dbname: str = "postgres", **kwargs: Any) -> psycopg.Connection[Any]:
        return psycopg.connect(
            host=str(self.root),
            port=PORT,
            user="postgres",
            dbname=dbname,
            autocommit=True,
            **kwargs,
        )

    def migrated_database(self, dbname: str, env: dict[str, str]) -> dict[str, str]:
        """Create database ``dbname`` with django-jobs' tables, as ``manage.py migrate`` makes
        them (a copy of :data:`TEMPLATE_DATABASE`); return ``env`` pointing at it."""
        self.query(f'CREATE DATABASE "{dbname}" TEMPLATE {TEMPLATE_DATABASE}')
        return {**env, "DATABASE_URL": self.url(dbname)}

    def query(self, sql: str, params: Any = None, dbname: str = "postgres") -> list[Any]:
        with self.connect(dbname) as conn:
            cursor = conn.execute(sql, params)
            return cursor.fetchall() if cursor.description else []

    # ------------------------------------------------------------------ life and death

    def start(self, timeout: float = 60) -> None:
        args = [str(self.bindir / "postgres"), "-D", str(self.data)]
        for name, value in self.settings.items():
            args += ["-c", f"{name}={value}"]
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, **self.run_as
            )
        deadline = time.monotonic() + timeout
        while True:
            try:
                with self.connect() as conn:
                    conn.execute("SELECT 1")
                return
            except psycopg.OperationalError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"PostgreSQL did not start; its log:\n{self.log.read_text()[-3000:]}"
                    ) from None
                time.sleep(0.1)

    @property
    def postmaster_pid(self) -> int:
        assert self.process is not None, "start() first"
        return self.process.pid

    def backend_pids(self) -> list[int]:
        return _children(self.postmaster_pid)

    def _process_named(self, title: str) -> int:
        for pid in self.backend_pids():
            with contextlib.suppress(OSError):
                if title in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
                    return pid
        raise LookupError(f"no '{title}' process under postmaster {self.postmaster_pid}")

    def stop_wal_writer(self) -> int:
        """SIGSTOP the WAL writer: an asynchronous commit then stays unwritten until a backend
        flushes the WAL itself (a synchronous commit does) or the server crashes."""
        pid = self._process_named("walwriter")
        os.kill(pid, signal.SIGSTOP)
        return pid

    def unwritten_wal(self) -> int:
        """Bytes of WAL inserted but not yet written to the operating system: what a crash
        would lose now."""
        rows = self.query("SELECT pg_current_wal_insert_lsn() - pg_current_wal_lsn()")
        return int(rows[0][0])

    def crash(self) -> None:
        """``kill -9`` of the postmaster, then of each of its children, by pid; wait until all
        are gone."""
        children = self.backend_pids()
        os.kill(self.postmaster_pid, signal.SIGKILL)
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        assert self.process is not None
        self.process.wait(timeout=30)
        deadline = time.monotonic() + 30
        while any(_alive(pid) for pid in children):
            if time.monotonic() > deadline:
                raise RuntimeError(f"PostgreSQL processes {children} outlived kill -9")
            time.sleep(0.02)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)  # fast shutdown
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.crash()

    def destroy(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


#: The database of the template cluster that ``manage.py migrate`` made: each throwaway
#: cluster's migrated databases are copies of it.
TEMPLATE_DATABASE = "django_jobs_migrated"

_templates: dict[int, Path] = {}


def _template() -> Path:
    """The data directory of a stopped cluster, made by initdb, with :data:`TEMPLATE_DATABASE`
    migrated by ``manage.py migrate``: once per test process (``_templates`` by pid), removed at
    its exit."""
    import atexit
    import sys

    if os.getpid() in _templates:
        return _templates[os.getpid()]
    root = Path(tempfile.mkdtemp(prefix="django-jobs-template-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    run_as = _run_as()
    if run_as:
        os.chown(root, run_as["user"], run_as["group"])
    data = root / "data"
    initdb = [str(_bindir() / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust"]
    subprocess.run([*initdb, "-E", "UTF8", "--no-sync"], check=True, capture_output=True, **run_as)
    cluster = CrashableCluster.__new__(CrashableCluster)
    cluster.bindir, cluster.run_as, cluster.root, cluster.data = _bindir(), run_as, root, data
    cluster.log, cluster.process = root / "postgres.log", None
    cluster.settings = {"listen_addresses": "", "unix_socket_directories": str(root)}
    cluster.settings["port"] = str(PORT)
    cluster.start()
    try:
        cluster.query(f"CREATE DATABASE {TEMPLATE_DATABASE}")
        env = {**os.environ, "DATABASE_URL": cluster.url(TEMPLATE_DATABASE)}
        env["DJANGO_SETTINGS_MODULE"] = "testproject.settings"
        manage = Path(__file__).resolve().parent.parent / "manage.py"
        subprocess.run([sys.executable, str(manage), "migrate", "-v0"], env=env, check=True)
    finally:
        cluster.stop()
    (root / "postgres.log").unlink(missing_ok=True)
    _templates[os.getpid()] = data
    return data


@contextlib.contextmanager
def running_cluster(settings: dict[str, str] | None = None) -> Iterator[CrashableCluster]:
    """A started throwaway cluster, destroyed afterwards; the test is skipped where there are no
    PostgreSQL binaries to start one with."""
    import pytest

    try:
        cluster = CrashableCluster(settings)
    except (FileNotFoundError, ImportError) as exc:
        pytest.skip(f"no PostgreSQL binaries to start a throwaway cluster: {exc}")
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.destroy()
