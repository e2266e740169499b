"""Periodic jobs, in one folder:

- :mod:`~django_jobs.schedules.cron`: cron expressions, shortcuts, time zones, next fire times;
- :mod:`~django_jobs.schedules.declarations`: schedules declared in code (``@job(schedule=...)``,
  ``JOBS_SCHEDULES``), their validation, and the sync into the table;
- :mod:`~django_jobs.schedules.ticks`: firing due ticks (one enqueue per tick), and the
  operators' pause, resume and run now;
- :mod:`~django_jobs.schedules.runner`: the scheduler step of a worker's loop, shared with
  ``runjobscheduler``;
- :mod:`~django_jobs.schedules.admin` and :mod:`~django_jobs.schedules.forms`: the admin.

The tables are :class:`django_jobs.models.Schedule` and :class:`django_jobs.models.ScheduleTick`.
"""
