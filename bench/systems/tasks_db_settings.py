"""Settings of the django-tasks-db runs: its app and backend on the database of ``DATABASE_URL``."""

import environ

env = environ.Env()

SECRET_KEY = "bench-only"
USE_TZ = True
DATABASES = {"default": env.db_url("DATABASE_URL")}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = ["django_tasks", "django_tasks_db"]
TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend", "QUEUES": ["default"]}}
