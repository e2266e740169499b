"""Settings of the benchmark runs of django-jobs: the test project's, plus the bench jobs.

The database comes from ``DATABASE_URL``, as in ``testproject.settings``.
"""

from testproject.settings import *  # noqa: F403
from testproject.settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "bench"]
