#!/usr/bin/env python3
"""How long masking secrets takes on 64 KiB of adversarial text: runs of word characters, of
``=``, of quotes, keys run together, scheme-like runs. Each must take well under 10 ms.

    python bench/masking.py            # with the project's virtualenv (.venv/bin/python)

The inputs are those of tests/unit/test_masking.py, which checks the results against the
reference patterns; this prints the median of 20 runs of each, in milliseconds, and the time an
executor takes to mask a job's 64 KiB line of hex digits printed in small writes.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    sys.path.insert(0, str(ROOT))
    from django.conf import settings

    settings.configure()  # masking reads JOBS_SENSITIVE_KEYS: the defaults
    from django_jobs.sanitize import mask_text
    from tests.unit.helpers import ADVERSARIAL

    print(f"{'input (64 KiB)':45} {'median ms':>10} {'max ms':>8}")
    for name, text in sorted(ADVERSARIAL.items()):
        times = []
        for _ in range(20):
            started = time.process_time()
            mask_text(text)
            times.append((time.process_time() - started) * 1000)
        print(f"{name:45} {statistics.median(times):10.2f} {max(times):8.2f}")
    executor_side(ADVERSARIAL["a run of hex digits"])


def executor_side(text: str) -> None:
    """The same text as a job prints it, in 100-character writes and one newline, through what
    an executor does with its job's output (worker/capture.py): masked once the line ends."""
    import os

    from django_jobs.worker.capture import MaskedLines, Sink

    sink = Sink(os.open(os.devnull, os.O_WRONLY))
    pieces = [text[i : i + 100] for i in range(0, len(text), 100)] + ["\n"]
    times = []
    for _ in range(20):
        masked = MaskedLines(sink, 64 * 1024)
        started = time.process_time()
        for piece in pieces:
            masked.write(piece)
        masked.flush()
        times.append((time.process_time() - started) * 1000)
    name = "hex digits, printed in 100-char writes"
    print(f"{name:45} {statistics.median(times):10.2f} {max(times):8.2f}")


if __name__ == "__main__":
    main()
