"""Checks for task options that Invoke hands over as strings: one clear line on bad input.

A check reads the option as declared (cli/options.py: its flag, default, bound and what a
number means) from an `Arg`, so no table here restates a flag by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpufleet.errors import UserError


@dataclass(frozen=True)
class Arg:
    """One option as its check sees it: every number is bounded, so a typo cannot run for
    ten minutes into 21 GB of memory."""

    flag: str  # --concurrency
    default: Any = None
    most: float | None = None
    expected: str | None = None  # what a number means, for the one line a bad value gets


def _bounded(number: float, arg: Arg, raw: object) -> None:
    if arg.most is not None and number > arg.most:
        raise UserError(f"{arg.flag} {raw}: at most {arg.most:g}")


def positive_float(value: str | float | None, arg: Arg) -> float:
    if value is None or value == "":
        return arg.default
    try:
        number = float(value)
    except (TypeError, ValueError):
        expected = arg.expected or "a number of seconds, such as 60"
        raise UserError(f"{arg.flag} {value!r}: expected {expected}") from None
    if not number > 0 or number != number or number == float("inf"):
        raise UserError(f"{arg.flag} {value!r}: expected a positive number")
    _bounded(number, arg, value)
    return number


def non_negative_int(value: str | int | None, arg: Arg) -> int:
    if value is None or value == "":
        return arg.default
    try:
        number = int(str(value))
    except ValueError:
        raise UserError(f"{arg.flag} {value!r}: expected a whole number >= 0") from None
    if number < 0:
        raise UserError(f"{arg.flag} {value!r}: expected a whole number >= 0")
    _bounded(number, arg, value)
    return number


def positive_int(value: str | int | None, arg: Arg) -> int:
    """A whole number >= 1 (0 is refused, never silently replaced by the default)."""
    if value is None or value == "":
        return arg.default
    number = non_negative_int(value, arg)
    if number < 1:
        raise UserError(f"{arg.flag} {value!r}: expected a whole number >= 1")
    return number


def int_list(values: str | list[str] | None, arg: Arg, least: int = 1) -> list[int]:
    """`1,10,64` or repeated flags; each an integer of at least `least` (GPU indexes start at
    0), duplicates removed in order."""
    if values is None:
        return []
    raw = [values] if isinstance(values, str) else list(values)
    out: list[int] = []
    for chunk in raw:
        for part in str(chunk).split(","):
            item = part.strip()
            if not item:
                raise UserError(
                    f"{arg.flag} {chunk!r}: empty value in the list (expected e.g. 1,10,64)"
                )
            try:
                number = int(item)
            except ValueError:
                raise UserError(f"{arg.flag} {chunk!r}: {item!r} is not a whole number") from None
            if number < least:
                raise UserError(f"{arg.flag} {chunk!r}: {number} must be at least {least}")
            _bounded(number, arg, item)
            if number not in out:
                out.append(number)
    return out
