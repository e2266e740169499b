"""Libraries that both the test suite (tests/) and the benchmark suite (bench/) import: a month
of job history generated in SQL (``history``), the Grafana dashboard's panel queries
(``grafana``), and a pgbouncer launched for a test or a measurement (``pgbouncer``).

Not part of the django-jobs package: pyproject.toml's package discovery includes
``django_jobs*`` only, so this never ships in the wheel. tests/ and bench/ run from the repository
root, which puts it on ``sys.path``.
"""
