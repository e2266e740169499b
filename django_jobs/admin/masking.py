"""Secret masking in the admin: the job's payloads, errors and tracebacks are shown masked
(by :mod:`django_jobs.sanitize`), and the fields holding them are named here so that the list
refuses to be filtered on them (see :meth:`django_jobs.admin.listing.JobList.lookup_allowed`).
"""

from __future__ import annotations

import json
from typing import Any

from django.utils.html import format_html
from django.utils.safestring import SafeString

from django_jobs.sanitize import mask_text, mask_value

#: Fields the job page shows masked, or not at all.
MASKED_FIELDS = {"args", "kwargs", "result", "error", "lease"}


def masked_json(value: Any) -> SafeString:
    """A JSON payload (args, kwargs, result), masked and indented, or ``-``."""
    if value is None:
        return format_html("<span>{}</span>", "-")
    text = json.dumps(mask_value(value), indent=2, sort_keys=True, ensure_ascii=False)
    return format_html('<pre class="dj-json">{}</pre>', text)


def masked_text(text: str) -> str:
    """A job's error, masked, or ``-``."""
    return mask_text(text) if text else "-"


def masked_error(error: str, traceback: str) -> SafeString | str:
    """An attempt's error, masked, with its masked traceback folded under it."""
    if not error and not traceback:
        return ""
    if not traceback:
        return mask_text(error)
    return format_html(
        '{}<details class="dj-traceback"><summary>traceback</summary><pre>{}</pre></details>',
        mask_text(error),
        mask_text(traceback),
    )
