"""What every task shares: help texts, one-line user errors, host selection, exit codes.

Heavy modules (fabric, paramiko, pydantic, rich) are imported inside functions so
`inv --list` stays fast. A user mistake exits 2 with one line; a failed host exits 1.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import invoke
from invoke.exceptions import Exit

# Short flags chosen by hand: one letter has one meaning in every task, and -h is always
# help (Invoke's automatic ones gave -h to --hosts in most tasks but --archive in bench).
SHORT_FLAGS = {
    "hosts": "H",
    "inventory": "i",
    "concurrency": "c",
    "profile": "p",
    "dry_run": "n",
    "archive": "a",
    "forks": "f",
}


class GpufleetTask(invoke.Task):
    """An Invoke task whose only short flags are SHORT_FLAGS."""

    def arg_opts(self, name: str, default: Any, taken_names: set[str]) -> dict[str, Any]:
        opts = super().arg_opts(name, default, taken_names)
        if name in SHORT_FLAGS:
            opts["names"].append(SHORT_FLAGS[name])
        return opts


def task(*args: Any, **kwargs: Any) -> Any:
    """`@task` for gpufleet's tasks: hand-picked short flags, none made up by Invoke."""
    kwargs.setdefault("klass", GpufleetTask)
    kwargs.setdefault("auto_shortflags", False)
    return invoke.task(*args, **kwargs)


HOSTS_HELP = (
    "hosts, groups or a comma list from the inventory (default: all); `healthy` or "
    "`healthy:NAMES`: skip those whose last gpu-clean found a bad GPU"
)
INVENTORY_HELP = "inventory file or name under hosts/ (default: $GPUFLEET_INVENTORY or rehearsal)"
FLEET_HELP = {
    "hosts": HOSTS_HELP,
    "inventory": INVENTORY_HELP,
    "forks": "hosts in parallel (default: the inventory's forks, 32)",
}


def user_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn a UserError into one line on stderr and exit code 2, never a traceback;
    scrub everything the task prints (cli/scrubbing.py); and keep one session per host
    for the whole task (control/sessionpool.py)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from gpufleet.cli import scrubbing
        from gpufleet.control import sessionpool
        from gpufleet.errors import UserError

        scrubbing.install()  # every byte printed from here on is scrubbed of secrets
        try:
            with sessionpool.for_task():  # one connection per host for the whole task
                return fn(*args, **kwargs)
        except UserError as exc:
            raise Exit(f"gpufleet: {exc}", code=2) from None
        except KeyboardInterrupt:
            raise Exit("gpufleet: interrupted", code=130) from None

    return wrapper


def finish(results: list[Any], with_tail: bool = False, report: bool = True) -> None:
    """Print each failed host's line (and server log tail); exit 1 if any host failed."""
    from gpufleet.cli.output import exit_code, print_failures

    if report:
        print_failures(results, with_tail)
    code, message = exit_code(results)
    if code:
        raise Exit(message, code=code)


def select_hosts(inventory: str | None, hosts: str | None):
    from gpufleet.control.inventory import load_inventory

    inv = load_inventory(inventory)
    only_healthy = hosts is not None and (hosts == "healthy" or hosts.startswith("healthy:"))
    if (
        only_healthy
    ):  # `healthy` or `healthy:NAMES`: skip hosts whose last gpu-clean found a bad GPU
        from gpufleet.cli.output import line
        from gpufleet.control.gpuclean import healthy

        chosen = hosts.partition(":")[2] or None  # type: ignore[union-attr]
        selected, skipped = healthy(inv.select(chosen))
        for text in skipped:
            line(f"skipped {text}")
    else:
        selected = inv.select(hosts)
    if not selected:
        from gpufleet.errors import UserError

        raise UserError(f"{inv.source}: no hosts selected")
    return inv, selected


def forks_for(inv: Any, forks: str | None) -> int:
    from gpufleet.cli.args import non_negative_int

    return non_negative_int(forks, "--forks", 0) or inv.forks
