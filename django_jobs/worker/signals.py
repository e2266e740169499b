"""Signals and the wake-up socket of the supervisor's loop.

The loop sleeps in one ``wait`` on its executors' pipes and a socket. A signal writes a byte to
that socket (``signal.set_wakeup_fd``), and so does a stop requested from another thread, so
that the loop wakes at once to react.
"""

from __future__ import annotations

import contextlib
import signal
import socket
from collections.abc import Callable
from typing import Any

#: The signals that stop a worker: the first gracefully, a second at once.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class WakeSocket:
    """A socket pair: :meth:`wake` makes :attr:`reader` ready, :meth:`drain` empties it."""

    def __init__(self) -> None:
        self.reader, self._writer = socket.socketpair()
        self.reader.setblocking(False)
        self._writer.setblocking(False)

    def wake(self) -> None:
        with contextlib.suppress(OSError):
            self._writer.send(b"\0")

    def drain(self) -> None:
        try:
            while self.reader.recv(4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass

    def install(self, handler: Callable[[int, Any], None]) -> dict[int, Any]:
        """Send the stop signals to ``handler``, and wake the loop on any signal; return what
        :meth:`restore` puts back."""
        previous: dict[int, Any] = {}
        for signum in STOP_SIGNALS:
            previous[signum] = signal.signal(signum, handler)
        previous[-1] = signal.set_wakeup_fd(self._writer.fileno(), warn_on_full_buffer=False)
        return previous

    @staticmethod
    def restore(previous: dict[int, Any]) -> None:
        signal.set_wakeup_fd(previous.pop(-1))
        for signum, handler in previous.items():
            signal.signal(signum, handler)
