"""An experiment's sweeps, run where it was asked: `inv sweep` and `inv rehearse` run one,
`inv tune` four (measure, verify, load step, bursts). The experiment holds what every one of
its sweeps shares (hosts, forks, launch options, Ctrl-C's token, the console it talks to),
so the tune's orchestration (control/tune/tune_run.py) calls `experiment.sweep` directly and no
call goes back up into the CLI. A sweep that does not finish raises `SweepUnfinished`; the
CLI turns it into an exit code and a pasteable `--resume` line.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from gpufleet.control.bench.request import BenchRequest
from gpufleet.control.connect.cancel import CancelToken
from gpufleet.control.connect.fleet import Fleet
from gpufleet.control.server.host_options import LaunchOptions
from gpufleet.control.sweep import sweep_run as sweeps
from gpufleet.control.sweep import sweep_state as sweep_state
from gpufleet.control.sweep.cells import ArmSpec
from gpufleet.kinds import SweepStatus
from gpufleet.report.select import ReportInput


@dataclass
class Console:
    """How an experiment talks to whoever started it (the CLI: printed lines, progress
    bars, the comparison table); `opened` hears of each sweep as it starts, so a Ctrl-C
    hint can name it."""

    line: Callable[[str], None]
    show_compare: Callable[[ReportInput, Path], None]
    launch_progress: Any = None
    bench_progress: Any = None
    opened: Callable[[sweep_state.SweepState], None] = lambda state: None


class SweepUnfinished(Exception):
    """A sweep ended with cells not done: interrupted (Ctrl-C) or failed."""

    def __init__(self, state: sweep_state.SweepState) -> None:
        super().__init__(f"sweep {state.sweep_id}: {state.record.status}")
        self.state = state

    @property
    def interrupted(self) -> bool:
        """The sweep stopped at Ctrl-C, rather than failed."""
        return self.state.record.status == SweepStatus.INTERRUPTED


@dataclass
class Experiment:
    """Where an experiment's sweeps run and how they report."""

    fleet: Fleet
    console: Console
    launch: LaunchOptions = field(default_factory=LaunchOptions)
    fail_fast: bool = False
    cancel: CancelToken = field(default_factory=CancelToken)
    stops_own_servers: bool = False  # an interrupt stops the cells' servers (inv tune's)

    def sweep(
        self,
        profiles: list[str],
        arms: list[ArmSpec],
        kind: str,
        resume: bool,
        *,
        request: BenchRequest,
        hooks: sweeps.CellHooks | None = None,
    ) -> sweep_state.SweepState:
        """One sweep of these cells (the latest one of them with `resume`), its comparison
        shown; SweepUnfinished unless every cell is done."""
        sweep_state.check_arms(profiles, arms)  # a bad profile or flag fails before anything starts
        root = request.archive
        state = sweep_state.open_state(
            root, profiles, self.fleet.hosts, request.concurrency,
            resume=resume, arms=arms, kind=kind, request=request,
        )  # fmt: skip
        self.console.opened(state)
        if resume:
            self.console.line(f"resuming sweep {state.sweep_id} ({state.record.status})")
            for host in state.record.hosts:
                if host not in self.fleet.names:
                    why = self.fleet.absent_why(host)
                    self.console.line(f"sweep {state.sweep_id}: {host} is not resumed here: {why}")
            if state.record.request is not None:  # what it was started with, whatever is given
                request = BenchRequest.from_json(state.record.request, root)
        setup = sweeps.SweepSetup(
            sweep_state.hosts_of(state, self.fleet), request, self.launch, self.console.line,
            self.fail_fast, (self.console.launch_progress, self.console.bench_progress),
            self.cancel, replace(hooks or sweeps.CellHooks(),
                                 stop_on_interrupt=self.stops_own_servers),
        )  # fmt: skip
        state = sweeps.run(state, setup)
        data = sweeps.report_input(state, root)
        if data.per_host or data.failures:
            self.console.show_compare(data, root.compare_dir(state.sweep_id))
        self.console.line(f"sweep {state.sweep_id}: {state.record.status} (state: {state.path})")
        if state.record.status != SweepStatus.DONE:
            raise SweepUnfinished(state)
        return state
