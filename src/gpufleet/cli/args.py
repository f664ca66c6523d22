"""Parse task options that Invoke hands over as strings, with one clear line on bad input."""

from __future__ import annotations

from gpufleet.errors import UserError


def positive_float(value: str | float | None, flag: str, default: float) -> float:
    if value is None or value == "":
        return default
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise UserError(f"{flag} {value!r}: expected a number of seconds, such as 60") from None
    if not number > 0 or number != number or number == float("inf"):
        raise UserError(f"{flag} {value!r}: expected a positive number")
    return number


def non_negative_int(value: str | int | None, flag: str, default: int) -> int:
    if value is None or value == "":
        return default
    try:
        number = int(str(value))
    except ValueError:
        raise UserError(f"{flag} {value!r}: expected a whole number >= 0") from None
    if number < 0:
        raise UserError(f"{flag} {value!r}: expected a whole number >= 0")
    return number


def int_list(values: str | list[str] | None, flag: str) -> list[int]:
    """`1,10,64` or repeated flags; each a positive integer, duplicates removed in order."""
    if values is None:
        return []
    raw = [values] if isinstance(values, str) else list(values)
    out: list[int] = []
    for chunk in raw:
        for part in str(chunk).split(","):
            item = part.strip()
            if not item:
                raise UserError(
                    f"{flag} {chunk!r}: empty value in the list (expected e.g. 1,10,64)"
                )
            try:
                number = int(item)
            except ValueError:
                raise UserError(f"{flag} {chunk!r}: {item!r} is not a whole number") from None
            if number < 1:
                raise UserError(f"{flag} {chunk!r}: {number} must be at least 1")
            if number not in out:
                out.append(number)
    return out
