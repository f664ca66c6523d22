"""Errors a user can cause and fix; the CLI prints them as one line, never a traceback."""

from gpufleet.kinds import Kind


class UserError(Exception):
    """A mistake in input or environment that the user can fix (bad YAML, unknown host...)."""


class HostError(Exception):
    """A failure on one host. Reported per host; never hides other hosts' results."""

    def __init__(
        self, message: str, kind: Kind = Kind.ERROR, tail: list[str] | None = None
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.tail = tail or []  # e.g. the server log's last lines after a crash
