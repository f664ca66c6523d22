"""What every task shares: help texts, one-line user errors, host selection, exit codes.

Heavy modules (fabric, paramiko, pydantic, rich) are imported inside functions so
`inv --list` stays fast. A user mistake exits 2 with one line; a failed host exits 1.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import invoke
from invoke.exceptions import Exit


class GpufleetTask(invoke.Task):
    """An Invoke task whose only short flags are the ones its options declare
    (cli/options.py: Option.short); Invoke's automatic ones gave -h to --hosts in most tasks
    but --archive in bench."""

    short_flags: ClassVar[dict[str, str]] = {}

    def arg_opts(
        self, name: str, default: Any, taken_names: set[str]
    ) -> dict[str, Any]:  # Invoke's
        opts = super().arg_opts(name, default, taken_names)
        if name in self.short_flags:
            opts["names"].append(self.short_flags[name])
        return opts


def task(*args: Any, short_flags: dict[str, str] | None = None, **kwargs: Any) -> Any:
    """`@task` for gpufleet's tasks: the declared short flags, none made up by Invoke."""
    klass = type("Task", (GpufleetTask,), {"short_flags": dict(short_flags or {})})
    kwargs.setdefault("klass", klass)
    kwargs.setdefault("auto_shortflags", False)
    return invoke.task(*args, **kwargs)


HOSTS_HELP = (
    "hosts, groups or a comma list from the inventory (default: all); `healthy` or "
    "`healthy:NAMES`: skip those whose last gpu-clean found a bad GPU"
)
INVENTORY_HELP = "inventory file or name under hosts/ (default: $GPUFLEET_INVENTORY or rehearsal)"


def user_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn a UserError into one line on stderr and exit code 2, never a traceback;
    scrub everything the task prints (cli/scrubbing.py); and keep one session per host
    for the whole task (control/connect/pool.py)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from gpufleet.cli import scrubbing
        from gpufleet.control.connect import pool as sessionpool
        from gpufleet.errors import UserError

        scrubbing.install()  # every byte printed from here on is scrubbed of secrets
        try:
            name = f"inv {fn.__name__.replace('_', '-')}"
            with interrupts_handled_by(None), sessionpool.for_task(name):  # one connection
                return fn(*args, **kwargs)  # per host for the whole task
        except UserError as exc:
            raise Exit(f"gpufleet: {exc}", code=2) from None
        except KeyboardInterrupt:
            raise Exit("gpufleet: interrupted", code=130) from None

    return wrapper


# What stops a task: Ctrl-C, and what `timeout`, a CI cancel, systemd or a scheduler's limit
# send (SIGTERM), or a closed terminal (SIGHUP). Each takes Ctrl-C's path (issue 81.8): a
# task killed by SIGTERM printed nothing and left its level and its server behind.
INTERRUPTS = ("SIGINT", "SIGTERM", "SIGHUP")


@contextlib.contextmanager
def interrupts_handled_by(handler: Callable[[int, Any], None] | None) -> Iterator[None]:
    """Every interrupting signal handled as Ctrl-C is, in this one place: by `handler`, or
    (None) by Python's own Ctrl-C handler, which raises KeyboardInterrupt; the previous
    handlers come back after. Outside the main thread (nothing to install) a no-op."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    numbers = [getattr(signal, name) for name in INTERRUPTS if hasattr(signal, name)]
    previous = {num: signal.getsignal(num) for num in numbers}
    for num in numbers:
        signal.signal(num, handler or signal.default_int_handler)
    try:
        yield
    finally:
        for num, old in previous.items():
            signal.signal(num, old if old is not None else signal.SIG_DFL)


def finish(results: Any, with_tail: bool = False, report: bool = True) -> None:
    """Print each host's warnings and each failed host's line (and server log tail) on
    stderr; exit 1 if any host failed (a FleetResult, control/connect/fanout.py)."""
    import sys

    from gpufleet.cli.output import line

    if report:
        for text in results.report(with_tail):
            line(text, sys.stderr)
    if results.exit_code():
        raise Exit(f"gpufleet: {results.summary()}", code=results.exit_code())


def select_hosts(options: Any) -> Any:
    """The Fleet (control/connect/fleet.py) that parsed options choose: --inventory, --hosts (or
    `healthy[:NAMES]`), --forks."""
    from gpufleet.cli.output import line
    from gpufleet.control.connect.fleet import Fleet
    from gpufleet.control.inventory.model import load_inventory

    inv = load_inventory(options.inventory)
    for node, why in inv.skipped.items():
        line(f"skipped {node}: {why}")
    hosts = options.hosts
    if hosts is not None and (hosts == "healthy" or hosts.startswith("healthy:")):
        # `healthy` or `healthy:NAMES`: skip hosts whose last gpu-clean found a bad GPU
        from gpufleet.control.server.gpuclean import healthy

        selected, skipped = healthy(inv.select(hosts.partition(":")[2] or None))
        for text in skipped:
            line(f"skipped {text}")
    else:
        selected = inv.select(hosts)
    if not selected:
        from gpufleet.errors import UserError

        raise UserError(f"{inv.source}: no hosts selected")
    forks = getattr(options, "forks", 0) or inv.forks
    return Fleet(selected, forks, inv.source, frozenset(inv.hosts), tuple(inv.skipped.items()))
