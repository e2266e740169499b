"""factory-boy factories for rows the tests start from."""

from __future__ import annotations

import factory
from django.utils import timezone

from django_jobs.models import Attempt, Job, Worker


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
