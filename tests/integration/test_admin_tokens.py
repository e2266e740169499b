"""API tokens in the admin: made (shown once, recorded as made by the user who made it),
revoked and deleted, each only with its permission."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.test import Client

from django_jobs.models import ApiToken
from django_jobs.tokens import auth
from tests.factories import UserFactory
from tests.integration.helpers import Api, logged_in

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("api_state")]

URL = "/admin/django_jobs/apitoken/"


def staff(name: str, *codenames: str) -> tuple[Any, Client]:
    """A staff user named ``name`` who may see the tokens and do what ``codenames`` say, and a
    test client logged in as them."""
    user = UserFactory(username=name, permissions=["view_apitoken", *codenames])
    return user, logged_in(user, HTTP_HOST="localhost")


NEW = {"name": "fleet", "queues": "remote, default", "can_enqueue": "on",
       "tasks": "remote.upper", "expires": "90d"}  # fmt: skip


def test_a_token_is_made_in_the_admin_and_shown_once() -> None:
    user, maker = staff("maker", "add_apitoken")
    form = maker.get(f"{URL}add/")
    assert form.status_code == 200 and b'name="expires"' in form.content
    made = maker.post(f"{URL}add/", NEW)
    assert made.status_code == 200, made.content[:2000]
    assert "no-store" in made["Cache-Control"]
    found = re.search(rb'<code id="api-token">(djt_[A-Za-z0-9_-]+)</code>', made.content)
    assert found, made.content[:2000]
    secret = found.group(1).decode()
    row = ApiToken.objects.get(name="fleet")
    assert row.token_hash == auth.digest(secret)
    assert (row.queues, row.can_enqueue, row.tasks) == (["default", "remote"], True,
                                                        ["remote.upper"])  # fmt: skip
    assert (row.user_id, row.created_by, row.expires_at is not None) == (user.pk, "maker", True)
    assert Api(secret).claim(queues=["remote"]).status_code == 204
    # Never again: neither the list nor the token's page shows it.
    for page in (maker.get(URL), maker.get(f"{URL}{row.pk}/change/")):
        assert page.status_code == 200 and b"fleet" in page.content
        assert secret.encode() not in page.content
        assert row.token_hash.encode() not in page.content


def test_a_bad_new_token_is_refused_with_the_fields_error() -> None:
    _, maker = staff("maker", "add_apitoken")
    for field, value, message in [
        ("name", "no spaces", b"letters, digits"),
        ("queues", " , ", b"at least one queue"),
        ("tasks", "no.such.task", b"not a registered task"),
        ("expires", "forever", b"not a lifetime"),
    ]:
        answer = maker.post(f"{URL}add/", {**NEW, field: value})
        assert answer.status_code == 200 and message in answer.content, field
    auth.create("fleet", ["remote"])
    taken = maker.post(f"{URL}add/", NEW)
    assert b"already exists" in taken.content
    assert ApiToken.objects.count() == 1


def test_making_revoking_and_deleting_need_their_permissions() -> None:
    _, viewer = staff("viewer")
    assert viewer.get(f"{URL}add/").status_code == 403
    assert viewer.post(f"{URL}add/", NEW).status_code == 403
    assert not ApiToken.objects.exists()
    row, secret = auth.create("fleet", ["remote"])
    viewer.post(URL, {"action": "revoke_tokens", "_selected_action": [row.pk]})
    viewer.post(URL, {"action": "delete_selected", "_selected_action": [row.pk], "post": "yes"})
    assert viewer.post(f"{URL}{row.pk}/delete/", {"post": "yes"}).status_code == 403
    row.refresh_from_db()
    assert row.revoked_at is None  # a forged POST without the permission changes nothing

    _, revoker = staff("revoker", "revoke_apitoken")
    revoker.post(URL, {"action": "revoke_tokens", "_selected_action": [row.pk]})
    row.refresh_from_db()
    assert row.revoked_at is not None
    auth.cache.forget()
    assert Api(secret).claim(queues=["remote"]).status_code == 401

    _, deleter = staff("deleter", "delete_apitoken")
    assert deleter.post(f"{URL}{row.pk}/delete/", {"post": "yes"}).status_code == 302
    assert not ApiToken.objects.exists()


def test_a_tokens_page_revokes_it_after_asking_and_the_list_shows_its_status() -> None:
    row, _ = auth.create("fleet", ["remote"], tasks=["remote.upper"])
    _, viewer = staff("viewer")
    assert b"dj-revoke-token" not in viewer.get(f"{URL}{row.pk}/change/").content
    assert viewer.post(f"{URL}{row.pk}/revoke/").status_code == 403
    _, revoker = staff("revoker", "revoke_apitoken")
    page = revoker.get(f"{URL}{row.pk}/change/").content.decode()
    assert f"{URL}{row.pk}/revoke/" in page
    ask = revoker.get(f"{URL}{row.pk}/revoke/")
    assert ask.status_code == 200 and b"Yes, revoke it" in ask.content
    row.refresh_from_db()
    assert row.revoked_at is None  # asking changes nothing
    assert b">active<" in revoker.get(URL).content and b"remote.upper" in revoker.get(URL).content
    done = revoker.post(f"{URL}{row.pk}/revoke/")
    assert done.status_code == 302
    row.refresh_from_db()
    assert row.revoked_at is not None
    assert b">revoked<" in revoker.get(URL).content
    assert b"dj-revoke-token" not in revoker.get(f"{URL}{row.pk}/change/").content


def test_the_new_tokens_page_has_a_copy_button() -> None:
    _, maker = staff("maker", "add_apitoken")
    made = maker.post(f"{URL}add/", NEW).content.decode()
    assert 'data-copy="api-token"' in made and "django_jobs/console.js" in made


def test_the_list_says_expired_by_the_databases_clock_not_the_web_servers(monkeypatch) -> None:
    from datetime import timedelta

    from django.db import connection
    from django.utils import timezone

    row, _ = auth.create("old", ["remote"])
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE django_jobs_api_token SET expires_at = now() - interval '1 minute' "
            "WHERE id = %s",
            [row.pk],
        )
    _, viewer = staff("viewer")
    real_now = timezone.now
    monkeypatch.setattr(timezone, "now", lambda: real_now() - timedelta(hours=1))  # a slow clock
    listing = viewer.get(URL).content.decode()
    assert ">expired<" in listing and ">active<" not in listing
    assert "<time datetime=" in listing  # times as the job list shows them, hover included
