"""Argument types shared by the management commands: each turns a bad value into a clear
usage error (exit code 2) instead of a traceback."""

from __future__ import annotations

import argparse
import copy
from collections.abc import Callable
from typing import Any


def whole_number(
    low: int, high: int | None = None, unit: str = "a whole number"
) -> Callable[[str], int]:
    """An ``int`` in ``[low, high]``."""

    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {unit}, got {value!r}") from None
        if high is None and number < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {number}")
        if high is not None and not low <= number <= high:
            raise argparse.ArgumentTypeError(f"must be between {low} and {high}, got {number}")
        return number

    return parse


def seconds(*, allow_zero: bool) -> Callable[[str], float]:
    """A number of seconds: positive, or with ``allow_zero`` not negative."""

    def parse(value: str) -> float:
        try:
            number = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected a number of seconds, got {value!r}"
            ) from None
        if allow_zero and number < 0:
            raise argparse.ArgumentTypeError(f"must not be negative, got {number}")
        if not allow_zero and number <= 0:
            raise argparse.ArgumentTypeError(f"must be positive, got {number}")
        return number

    return parse


def add_log_arguments(parser: argparse.ArgumentParser) -> None:
    """``--log-format`` and ``--log-level``, as the long-running commands take them."""
    parser.add_argument(
        "--log-format",
        choices=["text", "json"],
        default="text",
        help="text (default) or json: one JSON object per line, for log shippers.",
    )
    parser.add_argument(
        "--log-level",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        default="INFO",
        type=str.upper,
    )


#: The destinations of the options every Django command takes (``BaseCommand.create_parser``).
DJANGO_OPTIONS = frozenset(
    {"verbosity", "settings", "pythonpath", "traceback", "no_color", "force_color", "skip_checks"}
)


def add_subcommand(
    actions: argparse._SubParsersAction[Any], parent: argparse.ArgumentParser, name: str, **kw: Any
) -> argparse.ArgumentParser:
    """A subcommand that also takes Django's standard options (``--settings``, ``-v``…) after its
    name, as users type them: ``jobqueue list -v 2``. The copies default to nothing, so a value
    given before the subcommand still counts."""
    sub: argparse.ArgumentParser = actions.add_parser(name, **kw)
    for action in parent._actions:
        if action.dest in DJANGO_OPTIONS and action.option_strings:
            copied = copy.copy(action)
            copied.default = argparse.SUPPRESS
            copied.help = argparse.SUPPRESS
            sub._add_action(copied)
    return sub
