"""Long jobs that keep their work: steps and cursors that survive retries, crashes and deploys.

A job function with ``takes_context=True`` calls ``context.step(name, fn, ...)`` and
``context.save_cursor(name, value)`` (django_jobs/context.py); this package holds what those
calls share, whichever way the run reaches its queue (the job database, or the HTTP API):

- :mod:`~django_jobs.steps.values`: the checks a step's name and result, and a cursor's name and
  value, pass before anything is written;
- :mod:`~django_jobs.steps.run`: one run's view of its job's checkpoint, loaded once, on the
  first step or cursor the run asks for, so that a job that uses neither pays nothing.

The statements are in django_jobs/store/steps.py.
"""
