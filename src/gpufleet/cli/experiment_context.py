"""An experiment started from a task: its hosts, the console it prints through, Ctrl-C, and
the exit code and pasteable `--resume` line a sweep that did not finish ends with. Used by
`inv sweep`, `inv tune` and `inv rehearse`; the orchestration itself is control/sweep/experiment.py,
control/sweep/sweep_run.py and control/tune/tune_run.py.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from invoke.exceptions import Exit

from gpufleet.cli.common import interrupts_handled_by, select_hosts
from gpufleet.cli.compare_tasks import show_compare

LEFT_OUT = ("resume", "dry_run", "hosts", "inventory")  # the resume line sets these


def resume_command(base: list[str], words: list[str]) -> Callable[[str, list[str]], str]:
    """Build the pasteable `--resume` line: the task's options as given (OptionSet.given),
    its inventory and hosts."""
    import shlex

    def command(inventory: str, hosts: list[str]) -> str:
        tail = ["--inventory", inventory, "--hosts", ",".join(hosts), "--resume"]
        return shlex.join([*base, *words, *tail])

    return command


def resume_hint(fleet: Any, hosts: list[str], command: Callable[[str, list[str]], str]) -> str:
    """How to finish the sweep, in words that work when pasted: the command for the sweep's
    hosts this inventory can reach, and the others named with why (an inventory that lists
    them resumes them); never a `--hosts` this inventory would refuse."""
    skipped = dict(fleet.skipped)
    reachable = [h for h in hosts if h in fleet.listed and h not in skipped]
    away = [f"{h} ({fleet.absent_why(h)})" for h in hosts if h not in reachable]
    text = f"finish the sweep with `{command(fleet.source, reachable)}`" if reachable else ""
    if away:
        text += ("; " if text else "") + (
            f"not reachable from {fleet.source}: {', '.join(away)}: run the same with an "
            "inventory that lists them to finish their cells"
        )
    return text


@contextlib.contextmanager
def ctrl_c_stops(cancel: Any, hint: Callable[[], str]) -> Iterator[None]:
    """First Ctrl-C (or SIGTERM, SIGHUP: cli/common.py INTERRUPTS): nothing new starts, the
    cells in flight stop cleanly (see sweep.py). Second: exit at once; what runs on the
    hosts goes on and --resume finishes it."""
    import os
    import signal
    import sys

    from gpufleet.cli.output import line

    def on_sigint(signum: int, frame: Any) -> None:
        said = "" if signum == signal.SIGINT else f" ({signal.Signals(signum).name})"
        if not cancel.requested:
            cancel.request()
            line(f"gpufleet: stopping{said}: no new cell starts, cells in flight stop cleanly "
                 "(Ctrl-C again to abort now)", sys.stderr)  # fmt: skip
            return
        line(f"gpufleet: aborted{said}; {hint()}", sys.stderr)
        os._exit(130)

    with interrupts_handled_by(on_sigint):
        yield


@contextlib.contextmanager
def experiment(
    o: Any,
    command: Callable[[str, list[str]], str],
    launch: Any,
    fail_fast: bool = False,
    own_servers: bool = False,
) -> Iterator[Any]:
    """The Experiment a task's sweeps run in, on the hosts its options select, printing
    through the CLI; a sweep left unfinished exits 130 (interrupted) or 1 (failed cells),
    with the line that finishes it. `own_servers`: an interrupt stops the servers the
    cells launched (inv tune's arms) rather than leave their runs to finish detached."""
    from gpufleet.cli.output import line
    from gpufleet.cli.progress import bench_progress, launch_progress
    from gpufleet.control.sweep.experiment import Console, Experiment, SweepUnfinished

    fleet = select_hosts(o)
    opened: list[Any] = []
    shown = lambda data, out_dir: show_compare(data, "table", out_dir)  # noqa: E731
    console = Console(line, shown, launch_progress(), bench_progress(), opened.append)
    exp = Experiment(fleet, console, launch, fail_fast, stops_own_servers=own_servers)

    def hint() -> str:  # the hosts with cells left (a tune between sweeps: all of them)
        hosts = (opened[-1].hosts_left() or opened[-1].record.hosts) if opened else fleet.names
        return resume_hint(fleet, hosts, command)

    with ctrl_c_stops(exp.cancel, hint):
        try:
            yield exp
        except SweepUnfinished as unfinished:
            if unfinished.interrupted:
                raise Exit(f"gpufleet: interrupted; {hint()}", 130) from None
            said = f"gpufleet: some sweep cells did not finish (see above); {hint()}"
            raise Exit(said, 1) from None
