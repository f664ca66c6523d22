"""Invoke's command-line parsing, held to gpufleet's promises.

`inv` is Invoke's own program, so these fixes are made to its Program class when the task
collection loads (the `gpufleet` script shares them): a parse error (unknown flag, missing
value) is one line and exit code 2, like every other usage mistake, instead of Invoke's
exit 1; and `--help`/`-h` anywhere after a task name shows that task's help, even where a
positional argument would otherwise swallow it (`inv compare --help`).
"""

from __future__ import annotations

import re

from invoke.exceptions import Exit, ParseError
from invoke.parser import ParseResult
from invoke.program import Program

HELP_WORDS = ("--help", "-h")
ARGUMENT = re.compile(r"<Argument: ([\w-]+)[^>]*>")  # Invoke's repr of a flag, in its messages
_original_parse_tasks = Program.parse_tasks


def _parse_tasks(self: Program) -> None:
    rest = list(self.core.unparsed)
    if rest and rest[0] in self.collection.task_names and any(w in HELP_WORDS for w in rest[1:]):
        self.parser = self._make_parser()
        self.args.help.value = self.collection.transform(rest[0])
        self.tasks = ParseResult()
        return
    try:
        _original_parse_tasks(self)
    except ParseError as exc:
        message = ARGUMENT.sub(lambda m: "--" + m.group(1).replace("_", "-"), str(exc))
        raise Exit(f"gpufleet: {message}", code=2) from None


def install() -> None:
    """Apply the fixes above to Invoke's Program (idempotent)."""
    Program.parse_tasks = _parse_tasks  # type: ignore[method-assign]
