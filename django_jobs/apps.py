from django.apps import AppConfig
from django.utils.module_loading import autodiscover_modules


class DjangoJobsConfig(AppConfig):
    name = "django_jobs"
    verbose_name = "Jobs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Import every installed app's jobs.py so that its @job functions are registered.
        autodiscover_modules("jobs")
