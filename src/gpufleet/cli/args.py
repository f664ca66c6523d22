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


# --- checks that are more than a number ------------------------------------------------


def nonzero(check: Any) -> Any:
    """A number where 0 or absent means "not set" (None): --port, --duration."""
    return lambda value, arg: check(value, Arg(arg.flag, 0, arg.most, arg.expected)) or arg.default


def levels(value: Any, arg: Arg) -> list[int]:
    return int_list(value, arg) or list(arg.default or [])


def gpu_indexes(value: Any, arg: Arg) -> list[int]:
    return int_list(value, arg, least=0)


def interval(value: Any, arg: Arg) -> float:
    """Seconds, where 0 turns it off (--telemetry-interval)."""
    if value is not None and str(value).strip() in ("0", "0.0"):
        return 0.0
    return positive_float(value, arg)


def slo_spec(value: Any, arg: Arg) -> dict[str, float]:
    from gpufleet.host.bench.slo import parse_slo

    try:
        return parse_slo(value)
    except ValueError as exc:
        raise UserError(f"{arg.flag} {value}: {exc}") from None


def workload_spec(value: Any, arg: Arg) -> str:
    from gpufleet.control.bench.workloads import parse_workload

    parse_workload(value)  # a bad name or option: one line now
    return value or arg.default


def archive_root(value: Any, arg: Arg) -> Any:
    """The archive at --archive, else $GPUFLEET_ARCHIVE, else logs/ (Archive.at)."""
    from gpufleet.archive.layout import Archive

    return Archive.at(value)


def client_procs(value: Any, arg: Arg) -> int | str:
    """N generator processes per level, or `auto` (from the last level's CPU per token)."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    if isinstance(value, str) and not value.strip().isdigit():
        raise UserError(f"{arg.flag} {value!r}: expected a whole number >= 1 or auto")
    return positive_int(value, arg)


def depths(value: Any, arg: Arg) -> list[int]:
    """Static draft depths to measure, 1 to 16 (0, no drafting, is always measured)."""
    if not value:
        return list(arg.default)
    try:
        return sorted(int_list(value, arg))
    except UserError:
        raise UserError(
            f"{arg.flag} {value!r}: expected draft depths such as 1,2,3,5,7, each from 1 to "
            f"{arg.most:g} (0 is always measured)"
        ) from None


def choice(*allowed: str) -> Any:
    def check(value: Any, arg: Arg) -> Any:
        if value is None:
            return arg.default
        if value not in allowed:
            said = (
                ", ".join(allowed[:-1]) + " or " + allowed[-1] if len(allowed) > 1 else allowed[0]
            )
            raise UserError(f"{arg.flag} {value!r}: expected {said}")
        return value

    return check


def patterns(value: Any, arg: Arg) -> list[str]:
    return list(value or [])


def name_list(value: Any, arg: Arg) -> list[str]:
    """A comma list (or the flag repeated) of names, blanks dropped."""
    raw = [value] if isinstance(value, str) else list(value or [])
    return [n.strip() for chunk in raw for n in str(chunk).split(",") if n.strip()]
