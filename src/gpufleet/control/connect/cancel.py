"""Cooperative cancellation: the first Ctrl-C asks long work to stop starting new things.

The CLI sets the token from its SIGINT handler; sweeps check it between steps, and the
long host calls (waiting for health, watching a benchmark) run in short slices while a
token is given, so a request to stop is seen within one slice. Nothing running on a host
is killed by the token itself: each caller decides what a clean stop means at its step.
"""

from __future__ import annotations

import threading

SLICE_S = 2.0  # longest a host call runs before the caller looks at the token again


class Cancelled(Exception):
    """Work stopped at the user's request, at a point where resuming is safe."""


class CancelToken:
    """Set once, by the first Ctrl-C; long work checks it before starting the next thing."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def request(self) -> None:
        """Ask every holder to stop starting new work."""
        self._event.set()

    @property
    def requested(self) -> bool:
        """Whether a stop was asked."""
        return self._event.is_set()

    def check(self, doing: str) -> None:
        """Raise Cancelled (naming what was stopped) if a stop was requested."""
        if self._event.is_set():
            raise Cancelled(doing)
