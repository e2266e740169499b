"""The table of API tokens: who may claim, finish and enqueue jobs over the HTTP API.

A token is made by ``manage.py createjobtoken``, which prints it once; only its SHA-256 hash is
stored. A token holds a list of queues (``["*"]``: every queue), may be allowed to enqueue and
spawn (optionally only some tasks), may expire, and may act for a user, whose deactivation
refuses it.
Revoking one (the admin's action) stamps ``revoked_at``; the API refuses it from then on (within
the few seconds its servers cache a token, see :mod:`django_jobs.tokens.auth`).
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models.functions import Now

#: The queue list of a token that holds every queue.
ALL_QUEUES = "*"


class ApiToken(models.Model):
    name = models.CharField(
        max_length=100,
        unique=True,
        help_text="Who uses the token: a fleet, a team, a cluster. Shown in worker ids "
        "(api:NAME:worker).",
    )
    token_hash = models.CharField(max_length=64, unique=True, editable=False)
    #: The first characters of the token, to tell tokens apart without storing them.
    prefix = models.CharField(max_length=12, editable=False)
    queues = models.JSONField(help_text='The queues the token may claim from; ["*"]: every queue.')
    can_enqueue = models.BooleanField(
        default=False, help_text="Whether it may enqueue jobs, and spawn children of its jobs."
    )
    tasks = models.JSONField(
        default=list,
        blank=True,
        help_text="The tasks it may enqueue and spawn; empty: every task of its queues.",
    )
    expires_at = models.DateTimeField(
        null=True, blank=True, help_text="Refused from then on; empty: it never expires."
    )
    created_at = models.DateTimeField(db_default=Now(), editable=False)
    created_by = models.CharField(max_length=150, blank=True, default="")
    #: The user it acts for: refused while that user is inactive, deleted with that user. No
    #: constraint in the database: the job tables may live in another database than the users
    #: (JOBS_DATABASE), and a token whose user is gone is refused all the same.
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        db_constraint=False,
        related_name="job_api_tokens",
        help_text="The user who made it; the token is refused while that user is inactive.",
    )
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    revoked_at = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        db_table = "django_jobs_api_token"
        ordering = ["name"]
        verbose_name = "API token"
        permissions = [("revoke_apitoken", "Can revoke API tokens")]

    def __str__(self) -> str:
        return self.name

    @property
    def all_queues(self) -> bool:
        return ALL_QUEUES in self.queues

    def holds(self, queue: str) -> bool:
        return self.all_queues or queue in self.queues
