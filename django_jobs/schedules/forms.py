"""The admin's add/edit form of a schedule: the task is a choice of registered tasks, the cron
expression, time zone and arguments are checked by the scheduler's own validation before
anything is saved, and the arguments are shown masked (``JOBS_SENSITIVE_KEYS``) yet kept when
saved untouched.
"""

from __future__ import annotations

from typing import Any

from django import forms

from django_jobs.exceptions import InvalidOption
from django_jobs.models.schedule import Schedule
from django_jobs.registry import registry
from django_jobs.sanitize import MASK, is_sensitive, mask_value
from django_jobs.schedules.declarations import FIELDS, validate_schedule

#: The fields a schedule declared in code takes from the code: read-only in the admin.
CODE_OWNED = ["name", *FIELDS]

#: The fields :func:`~django_jobs.schedules.declarations.validate_schedule` checks, each with the
#: words by which its error message names it (in this order: "kwargs" before "args").
CHECKED = {
    "cron": ("cron",),
    "timezone": ("timezone", "time zone"),
    "catch_up": ("catch_up",),
    "overlap": ("overlap",),
    "when_queue_paused": ("when_queue_paused",),  # before "queue", a word of its messages
    "task": ("task",),
    "kwargs": ("kwargs", "keyword"),
    "args": ("args", "argument"),
    "queue": ("queue",),
    "priority": ("priority",),
}


def restore_masked(new: Any, old: Any) -> Any:
    """``new`` with each part that reads exactly as the masked ``old`` replaced by ``old``'s
    own: an operator who saves the form without retyping a masked secret keeps the secret,
    while a value typed over the mask replaces it."""
    if new == mask_value(old):
        return old
    if isinstance(new, dict) and isinstance(old, dict):
        return {
            k: (old[k] if is_sensitive(str(k)) and v == MASK else restore_masked(v, old[k]))
            if k in old
            else v
            for k, v in new.items()
        }
    if isinstance(new, list) and isinstance(old, list):
        return [restore_masked(v, old[i]) if i < len(old) else v for i, v in enumerate(new)]
    return new


class _JSONOf(forms.JSONField):
    """A JSON text field whose value must be of one type (a list of arguments, a dict of
    keyword arguments)."""

    def __init__(self, kind: type, example: str, **kwargs: Any) -> None:
        self.kind = kind
        super().__init__(
            initial=kind,
            help_text=f"JSON: {example}. Secrets are shown masked; leave them so to keep them.",
            **kwargs,
        )
        self.widget.attrs.update(rows=3, cols=60)

    def clean(self, value: Any) -> Any:
        value = super().clean(value)
        if value is None:
            return self.kind()
        if not isinstance(value, self.kind):
            raise forms.ValidationError(f"Enter a JSON {self.kind.__name__}, such as {self.empty}.")
        return value

    @property
    def empty(self) -> str:
        return "[]" if self.kind is list else "{}"


class ScheduleForm(forms.ModelForm):
    """A schedule typed in by an operator, for any registered task."""

    task = forms.ChoiceField(choices=(), help_text="A registered task (@job or @task).")
    args = _JSONOf(list, 'a list of positional arguments, such as [42, "csv"]', required=False)
    kwargs = _JSONOf(dict, 'an object of keyword arguments, such as {"fmt": "csv"}', required=False)

    class Meta:
        model = Schedule
        fields = CODE_OWNED

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if "task" in self.fields:
            names = registry.names()
            current = self.instance.task
            if current and current not in names:  # a task no longer registered: keep it shown
                names = [current, *names]
            choice_field = self.fields["task"]
            assert isinstance(choice_field, forms.ChoiceField)
            choice_field.choices = [("", "---------"), *((n, n) for n in names)]
        for name in ("args", "kwargs"):
            if name in self.fields and self.instance.pk is not None:
                self.initial[name] = mask_value(getattr(self.instance, name))

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        for name in ("args", "kwargs"):
            if name in cleaned and self.instance.pk is not None:
                cleaned[name] = restore_masked(cleaned[name], getattr(self.instance, name))
        if self.errors or not set(CHECKED) & set(self.fields):
            return cleaned
        values = {name: cleaned.get(name, getattr(self.instance, name)) for name in CHECKED}
        try:
            # Without the name, which its messages would start with: they name the field.
            validate_schedule(
                values.pop("task"),
                values.pop("cron"),
                values.pop("timezone"),
                values.pop("args"),
                values.pop("kwargs"),
                **values,
            )
        except InvalidOption as error:
            self.add_error(self._field_of(str(error)), str(error))
        return cleaned

    def _field_of(self, message: str) -> str | None:
        """The form field an error of :func:`validate_schedule` is about (``None``: the form)."""
        lowered = message.lower()
        for field, words in CHECKED.items():
            if field in self.fields and any(word in lowered for word in words):
                return field
        return None
