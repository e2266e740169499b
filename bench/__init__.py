"""The benchmark suite of django-jobs: throughput, enqueue, latency, scale and cost per job.

Run it with ``python3 bench/run.py`` (see ``bench/README.md``). The package is also a small
Django app (``bench.jobs`` registers the jobs the benchmarks enqueue), used through
``bench.settings``.
"""
