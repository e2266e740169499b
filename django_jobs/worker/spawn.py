"""Starting an executor process: the pool's seam to the operating system.

Each executor is a fresh interpreter (the ``spawn`` start method: nothing of the supervisor's
state, its connection included, is inherited), given its pipe to the supervisor, the write end of
its output pipe, the database settings, the settings module, the byte of shared memory that
says the supervisor is stopping it (see :class:`ExecutorProcess`), the fence's shared moment of
the last committed heartbeat, and the supervisor's pid, with which it dies (worker/fence.py).
Only the file descriptors handed to it are inherited, so an executor holds no copy of another
executor's pipe, and each pipe ends when its supervisor does.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import pickle
import struct
from multiprocessing.connection import Connection
from multiprocessing.context import SpawnProcess
from multiprocessing.process import BaseProcess
from typing import Any

from django.conf import settings

from django_jobs.worker.executor import executor_main
from django_jobs.worker.fence import FENCED, Fence

#: Bytes read from an executor's pipe at a time: a job's report, and its last progress, whole.
READ_SIZE = 64 * 1024

# The framing of multiprocessing's Connection.send(), which the executor sends with: the
# length of the pickle as a signed big-endian 32-bit integer, or -1 then a 64-bit one.
_LENGTH = struct.Struct("!i")
_LONG_LENGTH = struct.Struct("!Q")


class ExecutorEnd:
    """The supervisor's end of an executor's pipe.

    Jobs go down it in one write each (:meth:`send_bytes`, the pickle made by the caller). What
    comes back, sent by the executor with :meth:`Connection.send`, is read in one read for all
    that is in the pipe (a job's report, its last progress before it), where ``recv`` reads
    the header and the body of each message apart: one message per job, one read."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.fd = conn.fileno()
        # The start of a message not wholly read yet.
        self.partial = bytearray()

    def fileno(self) -> int:
        return self.fd

    def send(self, message: Any) -> None:
        self.conn.send(message)

    def send_bytes(self, data: bytes) -> None:
        self.conn.send_bytes(data)

    def close(self) -> None:
        self.conn.close()

    def messages(self) -> list[Any]:
        """The messages now whole, after one read: call it only when the pipe is ready to read
        (a wait said so), or it blocks. The start of a message that has not wholly arrived is
        kept for the next call (the pipe is ready again once more of it has). Raises
        :class:`EOFError` once the executor's end is closed, :class:`OSError` if broken."""
        data = os.read(self.fd, READ_SIZE)
        if not data:
            raise EOFError
        buffer = self.partial
        buffer += data
        messages = []
        start, end = 0, len(buffer)
        while end - start >= _LENGTH.size:
            (size,) = _LENGTH.unpack_from(buffer, start)
            body = start + _LENGTH.size
            if size == -1:
                if end - body < _LONG_LENGTH.size:
                    break
                (size,) = _LONG_LENGTH.unpack_from(buffer, body)
                body += _LONG_LENGTH.size
            if end - body < size:
                break
            messages.append(pickle.loads(buffer[body : body + size]))
            start = body + size
        del buffer[:start]
        return messages


#: What starting an executor gives: its process, the supervisor's end of its pipe, and the read
#: end of its output pipe (``None``: not captured).
Spawned = tuple[BaseProcess, ExecutorEnd, Connection | None]


class ExecutorProcess(SpawnProcess):
    """An executor process, which dies of a SIGTERM only when the supervisor sent it.

    A SIGTERM can reach an executor from outside: systemd's default ``KillMode=control-group``
    and ``kill -TERM -PGID`` signal every process of the worker at once. The executor must then
    leave the shutdown to the supervisor, which lets the job run on through ``--grace`` and
    releases it, instead of dying mid-job (the job would end crashed). So :meth:`terminate`, the
    supervisor's only way of sending SIGTERM to an executor (a timeout, a cancellation, a lost
    lease, the end of the grace period), first sets :attr:`stop_requested`, a byte of memory
    shared with the executor, whose SIGTERM handler ignores the signal while it is unset (see
    :func:`~django_jobs.worker.executor.executor_main`)."""

    def __init__(self, *args: Any, stop_requested: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stop_requested = stop_requested

    def terminate(self) -> None:
        if self.stop_requested.value != FENCED:  # keep the word that it stopped itself
            self.stop_requested.value = 1
        super().terminate()


def spawn_executor(index: int, fence: Fence | None = None) -> Spawned:
    """Start executor process ``index``, with its pipe and its output pipe; under ``fence``,
    it stops its job when the supervisor's heartbeats stop committing (worker/fence.py)."""
    context = multiprocessing.get_context("spawn")
    parent_conn, child_conn = context.Pipe(duplex=True)
    output, child_output = context.Pipe(duplex=False)
    # A plain shared byte, with no lock: one writer (the supervisor), one reader (the executor).
    stop_requested = context.RawValue("b", 0)
    process = ExecutorProcess(
        target=executor_main,
        args=(
            child_conn,
            child_output,
            _picklable_databases(),
            os.environ.get("DJANGO_SETTINGS_MODULE", ""),
            stop_requested,
            fence.terms() if fence is not None else None,
            os.getpid(),
        ),
        name=f"django-jobs-executor-{index}",
        daemon=True,
        stop_requested=stop_requested,
    )
    process.start()
    child_conn.close()
    child_output.close()
    # Read without blocking: a job's output is drained as far as it goes, then the loop goes on.
    os.set_blocking(output.fileno(), False)
    return process, ExecutorEnd(parent_conn), output


def _picklable_databases() -> dict[str, Any]:
    # Settings dicts are plain data; a round trip through JSON proves it before a spawn fails.
    databases = settings.DATABASES
    try:
        json.dumps(databases)
        return databases
    except TypeError:
        return {
            alias: {k: v for k, v in db.items() if _plain(v)} for alias, db in databases.items()
        }


def _plain(value: Any) -> bool:
    try:
        json.dumps(value)
        return True
    except TypeError:
        return False
