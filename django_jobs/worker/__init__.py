"""The worker: a supervisor process that owns all queue I/O, and executor processes that only run
job functions. See :mod:`django_jobs.worker.supervisor`."""
