"""Invoke entry point: `inv --list`. The tasks live in src/gpufleet/cli/tasks.py."""

from gpufleet.cli.tasks import ns

__all__ = ["ns"]
