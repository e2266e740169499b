"""Text that PostgreSQL can store.

PostgreSQL refuses two things a Python string may hold: the NUL character (in ``text`` and in
``jsonb`` alike) and lone surrogates (invalid Unicode, which cannot be encoded as UTF-8). Enqueue
refuses them in what it writes (:func:`unstorable`); a worker makes a job's result and error
text storable instead (:func:`storable_text`, :func:`storable_value`), since the job has already
run and its outcome must be recorded.
"""

from __future__ import annotations

import re
from typing import Any

#: What is appended to a text whose characters were changed to make it storable.
NOTE = "[django-jobs: NUL characters written as \\x00 and invalid Unicode as U+FFFD to store this]"

# A NUL or a surrogate escape in JSON text made by json.dumps (which writes ASCII): where none
# occurs (the common case), the value holds neither and needs no walk.
_SUSPECT_JSON = re.compile(r"\\u(?:0000|d[89a-f])", re.IGNORECASE)


def unstorable(text: str) -> str | None:
    """Why PostgreSQL cannot store ``text``, or ``None`` if it can."""
    if "\x00" in text:
        return "contains a NUL character (\\x00), which PostgreSQL cannot store"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "contains invalid Unicode (a lone surrogate), which PostgreSQL cannot store"
    return None


_SURROGATE = re.compile("[\ud800-\udfff]")


def _fixed(text: str) -> str:
    return _SURROGATE.sub("\ufffd", text.replace("\x00", "\\x00"))


def storable_text(text: str, *, note: bool = True) -> str:
    """``text`` as PostgreSQL can store it: NUL written as ``\\x00``, invalid Unicode as U+FFFD,
    and, if anything changed, :data:`NOTE` appended (unless ``note`` is false)."""
    if unstorable(text) is None:
        return text
    fixed = _fixed(text)
    return f"{fixed} {NOTE}" if note else fixed


def storable_value(value: Any) -> tuple[Any, bool]:
    """A JSON value with every string (keys included) made storable, without notes; and whether
    anything changed."""
    changed = False

    def walk(item: Any) -> Any:
        nonlocal changed
        if isinstance(item, str):
            if unstorable(item) is None:
                return item
            changed = True
            return _fixed(item)
        if isinstance(item, list | tuple):
            return [walk(element) for element in item]
        if isinstance(item, dict):
            return {walk(key) if isinstance(key, str) else key: walk(v) for key, v in item.items()}
        return item

    return walk(value), changed


def may_hold_unstorable(json_text: str) -> bool:
    """Whether JSON text made by :func:`json.dumps` may hold a NUL or a lone surrogate (a quick
    test: where it says yes, walk the value to be sure)."""
    return _SUSPECT_JSON.search(json_text) is not None


def storable_json(value: Any) -> tuple[str, bool]:
    """``value`` as JSON text that ``jsonb`` accepts, and whether strings had to change. Raises
    what :func:`json.dumps` raises for a value that is not JSON."""
    import json

    text = json.dumps(value, allow_nan=False)
    if not may_hold_unstorable(text):
        return text, False
    fixed, changed = storable_value(value)
    return (json.dumps(fixed, allow_nan=False), True) if changed else (text, False)
