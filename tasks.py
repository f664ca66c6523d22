"""Invoke entry point: `inv --list`. The tasks live in src/gpufleet/tasks.py."""

from gpufleet.tasks import ns

__all__ = ["ns"]
