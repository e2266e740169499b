"""A PostgreSQL array column without ``django.contrib.postgres``.

Django's ``ArrayField`` asks for ``django.contrib.postgres`` in ``INSTALLED_APPS`` (Django 6 checks
it: ``postgres.E005``), which a reusable app should not ask of every project that installs it.
The job system reads and writes its arrays in its own SQL, and psycopg turns PostgreSQL arrays
into Python lists and back, so a column type is all it needs.
"""

from __future__ import annotations

from typing import Any

from django.db import models


class PgArray(models.Field):
    """A column of PostgreSQL type ``<base_type>[]`` (``bigint[]``), read as a Python list."""

    description = "A PostgreSQL array"

    def __init__(self, *args: Any, base_type: str = "bigint", **kwargs: Any) -> None:
        self.base_type = base_type
        super().__init__(*args, **kwargs)

    def db_type(self, connection: Any) -> str:
        return f"{self.base_type}[]"

    def deconstruct(self) -> Any:
        name, path, args, kwargs = super().deconstruct()
        kwargs["base_type"] = self.base_type
        return name, path, args, kwargs

    def get_prep_value(self, value: Any) -> Any:
        return None if value is None else list(value)
