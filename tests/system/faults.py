"""What the fault tests of real workers share: workers whose heartbeats and timeouts are short,
so that a SIGKILLed or SIGSTOPped one is found gone in seconds, and a reaper that judges them by
the same clock."""

from __future__ import annotations

from django.test.utils import override_settings

from django_jobs.reaper import ReapReport, reap_pass
from tests.conftest import wait_for

#: A worker's environment: a heartbeat every 0.5 s, gone after 2 s without one.
FAST = {
    "JOBS_HEARTBEAT_INTERVAL": "0.5",
    "JOBS_WORKER_TIMEOUT": "2",
    "JOBS_KILL_GRACE": "1",
    "JOBS_POLL_INTERVAL": "0.2",
}
#: The reaper of this process, on the same terms.
fast_reaper = override_settings(JOBS_WORKER_TIMEOUT=2, JOBS_HEARTBEAT_INTERVAL=0.5)


def reap_once_stale() -> ReapReport:
    """Reap until a pass acts: once the worker's last heartbeat is older than
    JOBS_WORKER_TIMEOUT (2 s under ``fast_reaper``). That pass's report."""
    return wait_for(lambda: (passed := reap_pass()).actions and passed, timeout=15, interval=0.2)
