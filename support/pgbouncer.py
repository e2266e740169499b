"""Start a real pgbouncer (Debian's package) in transaction-pooling mode, for tests and benches.

Each pgbouncer is stopped by its pid, never by a pattern: by :meth:`PgBouncer.stop`, or else
when the Python process that started it exits. A run killed before either leaves its pgbouncer
behind, holding the test database open; so each one is recorded in ``.pids/`` of this checkout,
and :func:`stop_leftovers`, which ``scripts/dev.py test`` calls first, stops those and only those.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import json
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import psycopg

#: Debian installs it outside a normal user's PATH.
BINARY = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"

#: One record per running pgbouncer: ``pgbouncer-<pid>.json`` (gitignored).
PIDS = Path(__file__).resolve().parent.parent / ".pids"


def installed() -> bool:
    return Path(BINARY).exists()


#: The port in the name of pgbouncer's socket (``.s.PGSQL.6432``). pgbouncer listens on a Unix
#: socket in a directory of its own, not on TCP: no port to find free, and so no window in which
#: another process (another pgbouncer of a test run beside this one) could take it.
SOCKET_PORT = 6432


@dataclasses.dataclass
class PgBouncer:
    port: int
    user: str
    directory: Path
    process: subprocess.Popen[str]

    @property
    def log(self) -> str:
        path = self.directory / "pgbouncer.log"
        return path.read_text() if path.exists() else ""

    @property
    def record(self) -> Path:
        return PIDS / f"pgbouncer-{self.process.pid}.json"

    def url(self, dbname: str) -> str:
        return f"postgres://{self.user}@/{dbname}?host={self.directory}&port={self.port}"

    def console(self, command: str) -> list[dict[str, Any]]:
        """Run a SHOW command on the admin console."""
        with psycopg.connect(
            host=str(self.directory),
            port=self.port,
            user=self.user,
            dbname="pgbouncer",
            autocommit=True,
        ) as conn:
            cursor = conn.execute(command)
            names = [c.name for c in cursor.description]
            return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]

    def stop(self) -> None:
        atexit.unregister(self.stop)
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.directory, ignore_errors=True)
        self.record.unlink(missing_ok=True)


def start(host: str, port: int | str, user: str, pool_size: int = 3) -> PgBouncer:
    """Start pgbouncer in front of ``host:port`` with a pool of ``pool_size`` per database.

    ``host`` may be a Unix socket directory (a path), as for the embedded PostgreSQL.
    """
    # Not under a private temp dir: as root, pgbouncer drops to another user, who must reach it.
    directory = Path(tempfile.mkdtemp(prefix="django-jobs-pgbouncer-"))
    directory.chmod(0o777)
    listen = SOCKET_PORT
    (directory / "users.txt").write_text(f'"{user}" ""\n')
    config = directory / "pgbouncer.ini"
    config.write_text(
        textwrap.dedent(f"""
        [databases]
        * = host='{host}' port={port}

        [pgbouncer]
        listen_addr =
        listen_port = {listen}
        unix_socket_dir = {directory}
        auth_type = trust
        auth_file = {directory}/users.txt
        admin_users = {user}
        pool_mode = transaction
        default_pool_size = {pool_size}
        max_client_conn = 500
        server_reset_query =
        ; Close idle server connections soon: a pgbouncer left behind by a killed run must not
        ; keep the test database busy for long.
        server_idle_timeout = 5
        ignore_startup_parameters = extra_float_digits
        logfile = {directory}/pgbouncer.log
        pidfile = {directory}/pgbouncer.pid
    """)
    )
    for path in directory.iterdir():
        path.chmod(0o666)
    command = [BINARY, str(config)]
    if os.geteuid() == 0:
        command[1:1] = ["-u", _unprivileged_user(host)]  # pgbouncer will not run as root
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    bouncer = PgBouncer(listen, user, directory, process)
    PIDS.mkdir(exist_ok=True)
    bouncer.record.write_text(
        json.dumps({"pid": process.pid, "started_by": os.getpid(), "config": str(config)})
    )
    atexit.register(bouncer.stop)
    deadline = time.monotonic() + 15
    while True:
        try:
            bouncer.console("SHOW VERSION")
            return bouncer
        except psycopg.OperationalError:
            if process.poll() is not None or time.monotonic() > deadline:
                output = process.stdout.read() if process.poll() is not None else ""
                bouncer.stop()
                raise RuntimeError(f"pgbouncer did not start: {output}\n{bouncer.log}") from None
            time.sleep(0.1)


def _unprivileged_user(host: str) -> str:
    """Who pgbouncer runs as when started by root: whoever can reach the server.

    A socket directory may be private to the server's user (the embedded PostgreSQL's is), so
    run as its owner; otherwise as ``postgres``.
    """
    if host.startswith("/"):
        owner = pwd.getpwuid(Path(host).stat().st_uid).pw_name
        if owner != "root":
            return owner
    return "postgres"


def stop_leftovers() -> list[int]:
    """Stop the pgbouncers that test runs of this checkout started and left behind, by pid.

    A pgbouncer is left behind when the process that started it is no longer its parent (it
    died). A recorded pid that now belongs to another program is left alone. Returns the pids
    stopped.
    """
    stopped = []
    for path in sorted(PIDS.glob("pgbouncer-*.json")):
        record = json.loads(path.read_text())
        pid, config = record["pid"], record["config"]
        arguments = _arguments(pid)
        if arguments and Path(arguments[0]).name == "pgbouncer" and config in arguments:
            if _parent(pid) == record["started_by"]:
                continue  # a run still going, in another process
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
                deadline = time.monotonic() + 10
                while _arguments(pid) and time.monotonic() < deadline:
                    time.sleep(0.05)
                if _arguments(pid):
                    os.kill(pid, signal.SIGKILL)
            stopped.append(pid)
        shutil.rmtree(Path(config).parent, ignore_errors=True)
        path.unlink(missing_ok=True)
    return stopped


def _arguments(pid: int) -> list[str]:
    """The command line of process ``pid``; empty if it is gone (or a zombie)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return raw.decode(errors="replace").split("\0")[:-1]


def _parent(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The parent pid is the 4th field, after the command name in parentheses.
    return int(stat.rsplit(")", 1)[1].split()[1])
