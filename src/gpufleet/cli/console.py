"""The `gpufleet` console script: the same tasks as `inv`, usable outside the repo."""

from __future__ import annotations

from invoke import Program

from gpufleet import __version__
from gpufleet.cli.tasks import ns

program = Program(namespace=ns, version=__version__, name="gpufleet", binary="gpufleet")


def main() -> None:
    program.run()
