#!/usr/bin/env python3
"""How long masking secrets takes on 64 KiB of adversarial text: runs of word characters, of
``=``, of quotes, keys run together, scheme-like runs. Each must take well under 10 ms.

    python bench/masking.py            # with the project's virtualenv (.venv/bin/python)

The inputs are those of tests/unit/test_masking.py, which checks the results against the
reference patterns; this prints the median of 20 runs of each, in milliseconds.
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
    from tests.unit.test_masking import ADVERSARIAL

    print(f"{'input (64 KiB)':45} {'median ms':>10} {'max ms':>8}")
    for name, text in sorted(ADVERSARIAL.items()):
        times = []
        for _ in range(20):
            started = time.process_time()
            mask_text(text)
            times.append((time.process_time() - started) * 1000)
        print(f"{name:45} {statistics.median(times):10.2f} {max(times):8.2f}")


if __name__ == "__main__":
    main()
