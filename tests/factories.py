"""factory-boy factories for rows the tests start from."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import factory
from django.conf import settings
from django.contrib.auth.models import Permission
from django.utils import timezone

from django_jobs.models import ApiToken, Attempt, Job, Schedule, Worker
from django_jobs.tokens import auth


class JobFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Job

    task = "tests.noop"
    queue = "default"
    priority = 0
    state = Job.State.PENDING
    args = factory.LazyFunction(list)
    kwargs = factory.LazyFunction(dict)
    max_attempts = 3

    class Params:
        # A job a worker has claimed; pair it with an Attempt row where the test needs one.
        claimed = factory.Trait(
            state=Job.State.RUNNING,
            attempt=1,
            started_at=factory.LazyFunction(timezone.now),
            worker_id="pod-x:1:abcdef",
        )
        finished = factory.Trait(
            state=Job.State.DONE,
            attempt=1,
            started_at=factory.LazyFunction(timezone.now),
            finished_at=factory.LazyFunction(timezone.now),
            worker_id="old-worker:1:abcdef",
        )


class AttemptFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Attempt

    job = factory.SubFactory(JobFactory)
    number = 1
    worker_id = "w:1:abcdef"


class WorkerFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Worker

    id = factory.Sequence(lambda n: f"pod-{n}:1:{n:06x}")
    name = factory.LazyAttribute(lambda o: o.id.rsplit(":", 2)[0])
    host = "test-host"
    pid = 1
    queues = factory.LazyFunction(list)


class ScheduleFactory(factory.django.DjangoModelFactory):
    """A schedule as the admin saves one: its row, then its next run computed from its cron
    expression and time zone."""

    class Meta:
        model = Schedule
        skip_postgeneration_save = True

    name = factory.Sequence(lambda n: f"schedule-{n}")
    task = "tests.echo"
    cron = "* * * * *"

    @factory.post_generation
    def next_run(schedule: Schedule, create: bool, extracted: Any, **kwargs: Any) -> None:
        if create:
            schedule.recompute_next_run()


class UserFactory(factory.django.DjangoModelFactory):
    """A staff user with exactly the permissions named by codename
    (``UserFactory(permissions=["view_job"])``); ``superuser=True`` makes a superuser. The
    password is ``x`` unless given."""

    class Meta:
        model = settings.AUTH_USER_MODEL
        skip_postgeneration_save = True

    username = factory.Sequence(lambda n: f"staff-{n}")
    password = factory.django.Password("x")
    is_staff = True

    class Params:
        superuser = factory.Trait(is_superuser=True)

    @factory.post_generation
    def permissions(user: Any, create: bool, codenames: Sequence[str] | None, **_: Any) -> None:
        if create and codenames:
            user.user_permissions.set(Permission.objects.filter(codename__in=codenames))


class ApiTokenFactory(factory.Factory):
    """An API token, stored as ``createjobtoken`` stores one (``tokens.auth.create``): the row,
    with the token itself, which is not stored, as its ``secret``. It claims from ``default``
    and ``remote`` and may not enqueue unless told."""

    class Meta:
        model = ApiToken

    name = factory.Sequence(lambda n: f"token-{n}")
    queues = ("default", "remote")
    can_enqueue = False

    @classmethod
    def _create(cls, model_class: type[ApiToken], name: str, queues: Sequence[str],
                **options: Any) -> ApiToken:  # fmt: skip
        row, secret = auth.create(name, list(queues), **options)
        row.secret = secret
        return row

    @classmethod
    def _build(cls, model_class: type[ApiToken], *args: Any, **kwargs: Any) -> ApiToken:
        raise NotImplementedError("a token exists only stored: create it")
