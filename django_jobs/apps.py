import inspect

from django.apps import AppConfig
from django.utils.module_loading import autodiscover_modules, import_string

from django_jobs import conf

BACKEND = "django_jobs.backend.JobsBackend"


class DjangoJobsConfig(AppConfig):
    name = "django_jobs"
    verbose_name = "Jobs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django_jobs import checks  # noqa: F401 - registers the system checks

        # Import every installed app's jobs.py so that its @job functions are registered.
        autodiscover_modules("jobs")
        _declare_remote_tasks()
        # A @task function of Django's Tasks framework is registered when its module is
        # imported (JobsBackend.validate_task): import tasks.py too, but only where django-jobs
        # is the framework's backend, so that other task libraries' tasks.py stay untouched.
        if _serves_tasks_framework():
            autodiscover_modules("tasks")


def _declare_remote_tasks() -> None:
    """Declare the tasks of ``JOBS_REMOTE_TASKS``; a bad entry stops the app from starting."""
    from django.core.exceptions import ImproperlyConfigured

    from django_jobs.exceptions import InvalidOption
    from django_jobs.tasks import declare_remote_tasks

    try:
        declare_remote_tasks(conf.remote_tasks())
    except InvalidOption as error:
        raise ImproperlyConfigured(str(error)) from None


def _serves_tasks_framework() -> bool:
    """Whether Django's ``TASKS`` setting names JobsBackend (or a subclass) for some alias."""
    for params in conf.tasks_backends().values():
        try:
            backend = import_string(str(params.get("BACKEND", "")))
        except ImportError:
            continue  # the Tasks framework reports a bad BACKEND when the backend is used
        if inspect.isclass(backend) and any(
            f"{cls.__module__}.{cls.__qualname__}" == BACKEND for cls in inspect.getmro(backend)
        ):
            return True
    return False
