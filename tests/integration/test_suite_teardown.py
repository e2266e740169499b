"""What a transactional test's teardown leaves: every table it wrote to empty, and the content
types and permissions that migrations made, as they were (tests/conftest.py)."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission, User
from django.contrib.contenttypes.models import ContentType
from django.db import connection

from django_jobs.models import Attempt, Job
from tests.conftest import KEPT_TABLES, truncate_tables_with_rows
from tests.factories import AttemptFactory, JobFactory, WorkerFactory


def rows(table: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {connection.ops.quote_name(table)}")
        return int(cursor.fetchone()[0])


@pytest.mark.django_db(transaction=True)
def test_the_teardown_empties_the_tables_with_rows_and_keeps_permissions() -> None:
    permissions, content_types = Permission.objects.count(), ContentType.objects.count()
    assert permissions > 0 and content_types > 0
    job = JobFactory(claimed=True)
    AttemptFactory(job=job)
    WorkerFactory()
    user = User.objects.create_user("ann", password="pw")
    user.user_permissions.add(Permission.objects.get(codename="view_job"))

    emptied = truncate_tables_with_rows("default")

    assert {
        Job._meta.db_table,
        Attempt._meta.db_table,
        "django_jobs_worker",
        "auth_user",
        "auth_user_user_permissions",
    } <= set(emptied)
    assert not KEPT_TABLES & set(emptied)
    for table in emptied:
        assert rows(table) == 0, table
    assert Permission.objects.count() == permissions
    assert ContentType.objects.count() == content_types
    assert truncate_tables_with_rows("default") == []


@pytest.mark.django_db
def test_test_passwords_are_hashed_with_the_fast_test_hasher() -> None:
    user = User.objects.create_user("bob", password="correct horse battery")
    assert user.password.startswith("md5$")
    assert user.check_password("correct horse battery")
