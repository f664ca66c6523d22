"""Parse task options that Invoke hands over as strings, with one clear line on bad input."""

from __future__ import annotations

from gpufleet.errors import UserError

# Every numeric option is bounded, so a typo cannot run for ten minutes into 21 GB of memory.
LIMITS: dict[str, float] = {
    "--concurrency": 100_000,
    "--num-prompts": 100_000,
    "--output-len": 1_000_000,
    "--warmup": 1_000,
    "--port": 65_535,
    "--seed": 2**32 - 1,
    "--lines": 1_000_000,
    "--forks": 1_024,
    "--tolerance": 10_000_000,  # MiB
    "--timeout": 7 * 86_400,  # s
    "--grace": 3_600,
    "--duration": 7 * 86_400,
    "--request-rate": 1_000_000,  # requests/s
    "--telemetry-interval": 60,  # s
    "--random-input-len": 1_000_000,  # tokens
    "--random-output-len": 1_000_000,
    "--random-range-ratio": 1,
    "--trace-speedup": 10_000,
    "--repeat": 100,
    "--max-load": 1_000_000,
    "--max-probes": 100,
    "--target": 1,
}


# What a number means, for the one line a bad value gets (default: seconds).
EXPECTED: dict[str, str] = {
    "--request-rate": "a rate in requests per second, such as 4",
    "--trace-speedup": "a factor, such as 2",
    "--random-range-ratio": "a ratio above 0 and at most 1, such as 0.5",
    "--target": "a share above 0 and at most 1, such as 0.99",
    "--max-load": "a load (concurrency or requests per second), such as 256",
    "--min-request-speed": "a speed in tokens per second, such as 20",
}


def _bounded(number: float, flag: str, raw: object) -> None:
    limit = LIMITS.get(flag)
    if limit is not None and number > limit:
        raise UserError(f"{flag} {raw}: at most {limit:g}")


def positive_float(value: str | float | None, flag: str, default: float) -> float:
    if value is None or value == "":
        return default
    try:
        number = float(value)
    except (TypeError, ValueError):
        expected = EXPECTED.get(flag, "a number of seconds, such as 60")
        raise UserError(f"{flag} {value!r}: expected {expected}") from None
    if not number > 0 or number != number or number == float("inf"):
        raise UserError(f"{flag} {value!r}: expected a positive number")
    _bounded(number, flag, value)
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
    _bounded(number, flag, value)
    return number


def positive_int(value: str | int | None, flag: str, default: int) -> int:
    """A whole number >= 1 (0 is refused, never silently replaced by the default)."""
    if value is None or value == "":
        return default
    number = non_negative_int(value, flag, default)
    if number < 1:
        raise UserError(f"{flag} {value!r}: expected a whole number >= 1")
    return number


def int_list(values: str | list[str] | None, flag: str, least: int = 1) -> list[int]:
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
                    f"{flag} {chunk!r}: empty value in the list (expected e.g. 1,10,64)"
                )
            try:
                number = int(item)
            except ValueError:
                raise UserError(f"{flag} {chunk!r}: {item!r} is not a whole number") from None
            if number < least:
                raise UserError(f"{flag} {chunk!r}: {number} must be at least {least}")
            _bounded(number, flag, item)
            if number not in out:
                out.append(number)
    return out
