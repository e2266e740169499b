"""Secret masking in the admin: the job's payloads, errors and tracebacks are shown masked
(by :mod:`django_jobs.sanitize`), and the fields holding them are named here so that the list
refuses to be filtered on them (see :meth:`django_jobs.admin.listing.JobList.lookup_allowed`).
"""

from __future__ import annotations

import json
from typing import Any

from django.utils.html import format_html, format_html_join
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
        '{}<details class="dj-traceback"><summary>traceback</summary>{}</details>',
        mask_text(error),
        folded_traceback(traceback),
    )


#: A frame whose file is in this folder is django-jobs' own (its executor, its worker loop).
OWN_FOLDER = "/django_jobs/"


def own_frame(line: str) -> bool:
    """Whether ``line`` is a traceback's ``File "...", line n, in f`` line of a file inside the
    django_jobs package."""
    stripped = line.lstrip()
    if not stripped.startswith('File "'):
        return False
    end = stripped.find('"', 6)
    path = stripped[6 : end if end != -1 else len(stripped)].replace("\\", "/")
    return OWN_FOLDER in path


def frames(text: str) -> list[tuple[bool, list[str]]]:
    """``text``'s lines in runs: each run is django-jobs' own frames (True) or anything else.
    A frame is its ``File`` line and the lines indented deeper under it (its source line, the
    ``^^^`` marks). One pass over the lines, no regex: linear whatever the text."""
    runs: list[tuple[bool, list[str]]] = []
    frame_indent = -1  # the indent of the File line of the frame being read, -1 outside one
    own = False
    for line in text.splitlines():
        indent = len(line) - len(line.lstrip())
        if line.lstrip().startswith('File "'):
            own, frame_indent = own_frame(line), indent
        elif frame_indent < 0 or indent <= frame_indent or not line.strip():
            own, frame_indent = False, -1
        if runs and runs[-1][0] == own:
            runs[-1][1].append(line)
        else:
            runs.append((own, [line]))
    return runs


def folded_traceback(traceback: str) -> SafeString:
    """A traceback, masked, with each run of django-jobs' own frames folded away under
    "n django-jobs frames", so that the job's own code stands out."""
    parts = []
    for own, lines in frames(mask_text(traceback)):
        text = "\n".join(lines)
        if not own:
            parts.append(format_html("<pre>{}</pre>", text))
            continue
        count = sum(1 for line in lines if line.lstrip().startswith('File "'))
        parts.append(
            format_html(
                '<details class="dj-own-frames"><summary>{} django-jobs frame{}</summary>'
                "<pre>{}</pre></details>",
                count,
                "" if count == 1 else "s",
                text,
            )
        )
    return format_html(
        '<div class="dj-tb">{}</div>', format_html_join("", "{}", ((p,) for p in parts))
    )
