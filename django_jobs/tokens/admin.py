"""The admin of API tokens: who may use the HTTP API, for which queues and tasks, until when,
for which user, when last used; making one (permission ``django_jobs.add_apitoken``), revoking
(``django_jobs.revoke_apitoken``) and deleting (``django_jobs.delete_apitoken``).

A token made here is shown once, on the page that answers its creation (with a copy button), and
never again: only its hash is stored. A token's page has a Revoke button that asks first. Its
user is the one who made it. A token cannot be changed: make another with the scope you want and
revoke the old one.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import BooleanField, ExpressionWrapper, Q, QuerySet
from django.db.models.functions import Now
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.safestring import SafeString

from django_jobs import conf
from django_jobs.admin.actions import CheckedSelection
from django_jobs.admin.display import badge, moment
from django_jobs.exceptions import InvalidOption
from django_jobs.models.api_token import ApiToken
from django_jobs.store import db
from django_jobs.tokens import auth

FIELDS = ("name", "prefix", "queues", "can_enqueue", "tasks", "expires_at", "created_at",
          "created_by", "user", "last_used_at", "revoked_at")  # fmt: skip
#: What the creation form asks.
NEW_FIELDS = ("name", "queues", "can_enqueue", "tasks", "expires")


class NewTokenForm(forms.ModelForm):
    """A new token's name and scope, checked as ``manage.py createjobtoken`` checks them."""

    queues = forms.CharField(
        help_text="Comma-separated queues it may claim from (and enqueue to), or * for every "
        "queue (it enqueues only into the queues the settings declare)."
    )
    tasks = forms.CharField(
        required=False,
        help_text="Comma-separated tasks it may enqueue and spawn; empty: any task of its queues.",
    )
    expires = forms.CharField(
        required=False,
        help_text="Lifetime: 90d, 12h or 30m; empty: it never expires.",
    )

    class Meta:
        model = ApiToken
        fields = ["name", "can_enqueue"]

    def clean_name(self) -> str:
        name = str(self.cleaned_data["name"])
        if not auth.NAME.match(name):
            raise forms.ValidationError("Use letters, digits, '.', '_' and '-' (at most 100).")
        return name

    def clean_queues(self) -> list[str]:
        return _checked(auth.check_queues, str(self.cleaned_data["queues"]).split(","))

    def clean_tasks(self) -> list[str]:
        return _checked(auth.check_tasks, str(self.cleaned_data["tasks"]).split(","))

    def clean_expires(self) -> Any:
        text = str(self.cleaned_data["expires"] or "").strip()
        return _checked(auth.lifetime, text) if text else None


def _checked(check: Any, value: Any) -> Any:
    try:
        return check(value)
    except InvalidOption as error:
        raise forms.ValidationError(str(error)) from None


@admin.register(ApiToken)
class ApiTokenAdmin(CheckedSelection):
    list_display = ["name", "status", "prefix", "shown_queues", "can_enqueue", "shown_tasks",
                    "expires", "user", "last_used"]  # fmt: skip
    search_fields = ["name"]
    actions = ["revoke_tokens"]
    form = NewTokenForm

    class Media:
        css = {"all": ["django_jobs/admin.css", "django_jobs/console.css"]}
        js = ["django_jobs/console.js"]

    @admin.display(description="queues")
    def shown_queues(self, obj: ApiToken) -> str:
        return ", ".join(obj.queues)

    @admin.display(description="tasks")
    def shown_tasks(self, obj: ApiToken) -> str:
        return ", ".join(obj.tasks) or "any of its queues'"

    def get_queryset(self, request: HttpRequest) -> QuerySet[ApiToken]:
        """Each token, with whether it has expired by the database's clock, as the API checks."""
        expired = ExpressionWrapper(Q(expires_at__lte=Now()), output_field=BooleanField())
        return super().get_queryset(request).annotate(expired=expired)

    @admin.display(description="expires", ordering="expires_at")
    def expires(self, obj: ApiToken) -> SafeString | str:
        return moment(obj.expires_at, "never")

    @admin.display(description="last used", ordering="last_used_at")
    def last_used(self, obj: ApiToken) -> SafeString | str:
        return moment(obj.last_used_at, "never")

    @admin.display(description="status")
    def status(self, obj: ApiToken) -> SafeString:
        if obj.revoked_at is not None:
            return badge("error", "revoked")
        if getattr(obj, "expired", False):
            return badge("cancelled", "expired")
        return badge("done", "active")

    def get_urls(self) -> list[URLPattern]:
        revoke = path(
            "<int:pk>/revoke/",
            self.admin_site.admin_view(self.revoke_view),
            name="django_jobs_apitoken_revoke",
        )
        return [revoke, *super().get_urls()]

    def revoke_view(self, request: HttpRequest, pk: int) -> HttpResponse:
        """The token page's Revoke button: a page that asks first (GET), then revokes (POST)."""
        if not self.has_revoke_permission(request):
            raise PermissionDenied
        token = get_object_or_404(ApiToken, pk=pk)
        if request.method == "POST":
            db.commit_durably(conf.database_alias())  # under ATOMIC_REQUESTS
            auth.revoke([token.pk])
            self.message_user(
                request,
                f"Revoked the token {token.name}; servers of the API refuse it within "
                f"{auth.CACHE_SECONDS:.0f} seconds.",
                messages.SUCCESS,
            )
            return HttpResponseRedirect(reverse("admin:django_jobs_apitoken_change", args=[pk]))
        context = {
            **self.admin_site.each_context(request),
            "title": f"Revoke the API token {token.name}?",
            "opts": self.opts,
            "token": token,
        }
        return TemplateResponse(request, "admin/django_jobs/apitoken/revoke.html", context)

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        extra = {"can_revoke": self.has_revoke_permission(request), **(extra_context or {})}
        return super().change_view(request, object_id, form_url, extra)

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return FIELDS if obj is not None else NEW_FIELDS

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return FIELDS if obj is not None else ()

    def get_form(
        self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any
    ) -> Any:
        if obj is not None:
            kwargs["form"] = forms.ModelForm
        return super().get_form(request, obj, change, **kwargs)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # a token's scope is fixed: make another, revoke this one

    def has_revoke_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("django_jobs.revoke_apitoken")

    def save_model(self, request: HttpRequest, obj: ApiToken, form: Any, change: bool) -> None:
        """Store the new token as ``createjobtoken`` does, its user the one who made it; the
        token itself is kept on ``obj`` only until :meth:`response_add` shows it."""
        data = form.cleaned_data
        row, secret = auth.create(
            data["name"],
            data["queues"],
            can_enqueue=bool(data["can_enqueue"]),
            tasks=data["tasks"],
            expires_in=data["expires"],
            user=request.user,
        )
        for field in ApiToken._meta.concrete_fields:
            setattr(obj, field.attname, getattr(row, field.attname))
        obj._state.adding = False
        obj._state.db = row._state.db
        obj.shown_once = secret  # type: ignore[attr-defined]

    def response_add(
        self, request: HttpRequest, obj: Any, post_url_continue: Any = None
    ) -> HttpResponse:
        secret = getattr(obj, "shown_once", None)
        if secret is None:
            return super().response_add(request, obj, post_url_continue)
        context = {
            **self.admin_site.each_context(request),
            "title": f"API token {obj.name}",
            "opts": self.opts,
            "token": obj,
            "secret": secret,
        }
        response = TemplateResponse(request, "admin/django_jobs/apitoken/created.html", context)
        response["Cache-Control"] = "no-store"
        return response

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
