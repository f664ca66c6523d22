"""What `inv launch` asks of every host, as the task parses it (cli/tasksets.py); a light
module, since `inv --list` reads its defaults."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class LaunchOptions:
    replace: bool = False
    clean: bool = False
    engine: str | None = None
    timeout_s: float | None = None
    skip_flag_check: bool = False
    grace_s: float = 15.0
    allow_unhealthy: bool = False  # launch on a GPU the health check calls bad (recorded)
