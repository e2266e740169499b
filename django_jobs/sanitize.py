"""Masking secrets in what django-jobs stores and shows: tracebacks, error messages, arguments."""

from __future__ import annotations

import re
import traceback as tb
from typing import Any

from django_jobs.conf import sensitive_keys

MASK = "********"


def is_sensitive(key: str) -> bool:
    lowered = key.lower()
    return any(k in lowered for k in sensitive_keys())


def mask_value(value: Any) -> Any:
    """Return a copy of a JSON value with the values of sensitive keys masked, and the secrets
    :func:`mask_text` finds masked in its strings (``"--password=..."``, a database URL)."""
    if isinstance(value, dict):
        return {k: MASK if is_sensitive(str(k)) else mask_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [mask_value(v) for v in value]
    if isinstance(value, str):
        return mask_text(value)
    return value


# A quoted value: up to the closing quote of the same kind, past escaped quotes.
QUOTED = r""""(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*'"""
# The scheme of an Authorization header, masked with its credentials: "Authorization: Basic
# dXNlcjpwdw==" must not keep the credentials because the scheme was taken for the value.
AUTH_SCHEME = r"(?:bearer|basic|digest|token|negotiate)\s+"


def _patterns() -> list[re.Pattern[str]]:
    keys = "|".join(re.escape(k) for k in sensitive_keys())
    return [
        # key=value, key: value, "key": "value", key='value', headers["key"] = "value"
        re.compile(
            rf"""(?i)(["']?[\w-]*(?:{keys})[\w-]*["']?\]?\s*[:=]=?\s*)"""
            rf"""({QUOTED}|(?:{AUTH_SCHEME})?[^\s,;)}}\]]+)"""
        ),
        # credentials in URLs: scheme://user:password@host
        re.compile(r"(\b[a-z][a-z0-9+.-]*://[^/\s:@]*:)([^@\s/]+)(@)"),
        # bearer tokens
        re.compile(r"(?i)(bearer\s+)([a-z0-9._~+/=-]+)"),
    ]


def mask_text(text: str) -> str:
    """Mask obvious secrets in free text such as a traceback."""
    key_value, url, bearer = _patterns()
    text = key_value.sub(lambda m: m.group(1) + MASK, text)
    text = url.sub(lambda m: m.group(1) + MASK + m.group(3), text)
    return bearer.sub(lambda m: m.group(1) + MASK, text)


def format_exception(exc: BaseException) -> str:
    return mask_text("".join(tb.format_exception(exc)))[-20000:]
