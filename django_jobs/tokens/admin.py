"""The admin of API tokens: who may use the HTTP API, for which queues, when last used; and
revoking (permission ``django_jobs.revoke_apitoken``). Tokens are made with
``manage.py createjobtoken``, which prints a token once: the admin never shows one.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from django_jobs import conf
from django_jobs.models.api_token import ApiToken
from django_jobs.store import db
from django_jobs.tokens import auth

FIELDS = ("name", "prefix", "queues", "can_enqueue", "created_at", "created_by", "last_used_at",
          "revoked_at")  # fmt: skip


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ["name", "prefix", "shown_queues", "can_enqueue", "created_at", "last_used_at",
                    "revoked_at"]  # fmt: skip
    list_filter = ["can_enqueue"]
    search_fields = ["name"]
    actions = ["revoke_tokens"]
    fields = FIELDS
    readonly_fields = FIELDS

    @admin.display(description="queues")
    def shown_queues(self, obj: ApiToken) -> str:
        return ", ".join(obj.queues)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # manage.py createjobtoken prints the token once

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_revoke_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("django_jobs.revoke_apitoken")

    @admin.action(description="Revoke selected tokens", permissions=["revoke"])
    def revoke_tokens(self, request: HttpRequest, queryset: QuerySet[ApiToken]) -> None:
        db.commit_durably(conf.database_alias())  # under ATOMIC_REQUESTS
        count = auth.revoke(list(queryset.values_list("pk", flat=True)))
        self.message_user(
            request,
            f"Revoked {count} token(s); servers of the API refuse them within "
            f"{auth.CACHE_SECONDS:.0f} seconds.",
            messages.SUCCESS,
        )
