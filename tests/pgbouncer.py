"""Start a real pgbouncer (Debian's package) in transaction-pooling mode, for tests and benches."""

from __future__ import annotations

import dataclasses
import os
import shutil
import socket
import subprocess
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import psycopg

#: Debian installs it outside a normal user's PATH.
BINARY = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"


def installed() -> bool:
    return Path(BINARY).exists()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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

    def url(self, dbname: str) -> str:
        return f"postgres://{self.user}@127.0.0.1:{self.port}/{dbname}"

    def console(self, command: str) -> list[dict[str, Any]]:
        """Run a SHOW command on the admin console."""
        with psycopg.connect(
            host="127.0.0.1", port=self.port, user=self.user, dbname="pgbouncer", autocommit=True
        ) as conn:
            cursor = conn.execute(command)
            names = [c.name for c in cursor.description]
            return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)
        shutil.rmtree(self.directory, ignore_errors=True)


def start(host: str, port: int | str, user: str, pool_size: int = 3) -> PgBouncer:
    """Start pgbouncer in front of ``host:port`` with a pool of ``pool_size`` per database."""
    # Not under a private temp dir: pgbouncer drops to the postgres user, who must reach it.
    directory = Path(tempfile.mkdtemp(prefix="django-jobs-pgbouncer-"))
    directory.chmod(0o777)
    listen = free_port()
    (directory / "users.txt").write_text(f'"{user}" ""\n')
    config = directory / "pgbouncer.ini"
    config.write_text(
        textwrap.dedent(f"""
        [databases]
        * = host={host} port={port}

        [pgbouncer]
        listen_addr = 127.0.0.1
        listen_port = {listen}
        unix_socket_dir =
        auth_type = trust
        auth_file = {directory}/users.txt
        admin_users = {user}
        pool_mode = transaction
        default_pool_size = {pool_size}
        max_client_conn = 500
        server_reset_query =
        ; Close idle server connections soon: a pgbouncer left behind by a killed run must not
        ; keep the test database busy for the next one.
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
        command[1:1] = ["-u", "postgres"]  # pgbouncer will not run as root
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    bouncer = PgBouncer(listen, user, directory, process)
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
