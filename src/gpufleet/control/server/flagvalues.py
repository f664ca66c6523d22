"""A profile's flag values as numbers and GPU claims: what every engine adapter reads
(control/server/engines.py, control/server/llamacpp.py)."""

from __future__ import annotations

from typing import Literal

from gpufleet.records import FlagValue

Flags = dict[str, FlagValue]  # a profile's `flags:` (name -> value)


def flag_int(flags: Flags, *names: str) -> int | None:
    """The first of `names` the flags give a number (None: none does, or not as a number)."""
    for name in names:
        value = flags.get(name)
        # a bare flag (True) or one left out has no number; 1 and 0 do (1 == True in Python)
        if value is not None and not isinstance(value, bool):
            try:
                return int(str(value))
            except ValueError:
                return None
    return None


EVERY_GPU = "every"  # a claim: every GPU the server sees
GpuClaim = list[int] | Literal["every"] | None


def positive(value: int | None) -> int | None:
    """The value where it is above 0 (llama.cpp's -1 means "auto": unknown here)."""
    return value if value is not None and value > 0 else None
