"""Wall-clock limits in tests: the rule they follow, and the margin they share.

The suite runs on several processes side by side (pytest-xdist, one per core) on a machine
that other work may share, so a correct feature can take several times longer there than on an idle
machine. No test may fail for that alone. So:

1. Where it can, a test measures something a busy machine does not change: a count of
   statements, round trips, attempts or polls; an ordering; an event observed; a difference of
   the database's own timestamps, compared in SQL; the CPU time of the thread that did the work
   (other processes waiting for a core do not add to it).
2. Where it must compare a wall-clock duration with a bound, the bound is written as what the
   feature is expected to take plus :data:`BUSY_MACHINE_MARGIN`
   (``took < EXPECTED + BUSY_MACHINE_MARGIN``), next to a comment that says what the broken
   behaviour the test guards takes. That must lie clearly outside the bound, so that the test
   still fails when the feature is broken: where it would not, the test's own settings move the
   broken case further out (a lock timeout of 30 s, say), never the bound.
"""

from __future__ import annotations

#: Seconds a busy machine may add to what a test expects an operation to take: the test's
#: process, a worker or PostgreSQL waiting for a core behind the other tests' processes.
BUSY_MACHINE_MARGIN = 5.0

#: Seconds a busy machine may take to start a Python process that sets up Django and the app
#: and reaches the database: about a second on an idle machine, 4-5 s seen at a load of 15 on
#: two cores.
PROCESS_START = 15.0

#: Seconds of CPU time that work measured in milliseconds on an idle machine may take in a test
#: (measured with ``time.thread_time()``, which another process using the cores does not add to):
#: over a hundred times the expected figure, and far under the quadratic cases it guards against,
#: which take tens of seconds to minutes.
CPU_BOUND = 1.0

#: A lock timeout long enough that a statement waiting for a lock stands out from any delay of a
#: busy machine, in milliseconds (``JOBS_LOCK_TIMEOUT_MS``): the tests that check that something
#: does *not* wait for a lock set it, so that waiting would take 30 s (as long as the default
#: ``JOBS_STATEMENT_TIMEOUT_MS``, which also ends a wait), six times BUSY_MACHINE_MARGIN.
LOCK_WAIT_MS = 30_000
