"""What the system tests share that is not a fixture (their shared fixtures are in
``tests/system/conftest.py``).

Test modules import from here, never from one another.
"""

from __future__ import annotations

# ---------------------------------------------------------------------- workers' timings

#: A worker's environment for the tests that kill, stop or cut off workers: a heartbeat every
#: 0.5 s, gone after 2 s without one, 1 s of grace before a kill, a poll every 0.2 s. A module
#: whose workers need other values says so beside its use (``{**FAST_WORKER, ...}``).
FAST_WORKER = {
    "JOBS_HEARTBEAT_INTERVAL": "0.5",
    "JOBS_WORKER_TIMEOUT": "2",
    "JOBS_KILL_GRACE": "1",
    "JOBS_POLL_INTERVAL": "0.2",
}
#: The environment of the HTTP API's server and of its workers (``runjobworker --api``): as
#: :data:`FAST_WORKER`, gone after 3 s without a heartbeat.
FAST_API_WORKER = {**FAST_WORKER, "JOBS_WORKER_TIMEOUT": "3"}
