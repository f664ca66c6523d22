"""inv sweep: for each cell (a profile, at a point of its flag grid, per repeat: see
control/sweep/cells.py), on all hosts in parallel, gpu-clean -> launch -> bench -> stop -> verify
clean; then compare. State is saved after every step so `--resume` finishes an interrupted
sweep without redoing what succeeded. One cell on one host, and its resume, is
control/sweep/sweep_cell.py; this module is the loop over the cells.

Interruption (docs/RELIABILITY.md, "Ctrl-C during a sweep"): once a stop is asked (the
cancel token), no new cell starts. A cell still cleaning, launching or waiting for health
is cancelled cleanly (its server stopped) and `--resume` runs it again; a cell whose
benchmark has started keeps running on the host and `--resume` re-attaches, archives it
and stops the server; a cell that is stopping finishes stopping. `--resume` re-runs every
cell whose archived run failed (the failed archive stays, marked superseded).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpufleet.archive.kept import Cell
from gpufleet.archive.layout import Archive
from gpufleet.control.bench import run as benchrun
from gpufleet.control.connect.base import Session
from gpufleet.control.connect.cancel import CancelToken
from gpufleet.control.connect.fleet import Fleet
from gpufleet.control.server import lifecycle as server
from gpufleet.control.sweep import drain
from gpufleet.control.sweep.cells import ArmSpec
from gpufleet.control.sweep.sweep_cell import LOST, SweepCell, label
from gpufleet.control.sweep.sweep_state import Say, SweepState
from gpufleet.kinds import CellStatus, Kind, SweepStatus
from gpufleet.report import select
from gpufleet.report.html import ReportInput


@dataclass
class CellHooks:
    """What a sweep asks before each cell and tells after it (inv tune's time budget,
    control/tune/budget.py): `drop(arm)` gives why to leave the cell out (None: run it);
    `after(arm, state, ran)` hears of each cell the sweep ran (`ran`) or found done."""

    drop: Callable[[ArmSpec], str | None] = lambda arm: None
    after: Callable[[ArmSpec, SweepState, bool], None] = lambda arm, state, ran: None
    # at an interrupt, a benching cell's server is stopped (its run with it) and the cell
    # runs again at --resume, rather than left to finish detached: a tune's arms are servers
    # it launched for itself, which nobody else would stop (issue 81.8)
    stop_on_interrupt: bool = False


def _cell(session: Session, state: SweepState, arm: ArmSpec, setup: SweepSetup) -> SweepCell:
    cell = SweepCell(
        session,
        state,
        arm,
        setup.request,
        launch=setup.launch,
        cancel=setup.cancel,
        progress=setup.progress,
    )
    cell.stop_on_interrupt = setup.hooks.stop_on_interrupt
    return cell


def _pipeline(cell: SweepCell) -> benchrun.ArchivedRun:
    """One cell, resumed where an interruption left it or run afresh."""
    return cell.resume() or cell.run()


def _record(state: SweepState, name: str, res: Any) -> bool:
    """Write one cell's outcome into the state and say it; True if the cell failed."""
    say = state.say
    if res.ok and res.value.done:
        state.update(
            name, res.host.name, status=CellStatus.DONE, run_id=res.value.run_id,
            path=res.value.path, error=None,
        )  # fmt: skip
        steps = state.cell(name, res.host.name).steps_s
        took = ", ".join(f"{k} {v:.1f}s" for k, v in steps.items())
        say(
            f"[sweep] {label(name)} on {res.host.name}: done"
            + (f" ({took})" if took else "")
            + f", archived {res.value.path}"
        )
        return False
    if not res.ok and res.kind == Kind.CANCELLED:
        where = state.cell(name, res.host.name).status
        then = "--resume re-attaches it" if where == "benching" else "--resume runs it again"
        say(f"[sweep] {label(name)} on {res.host.name}: {res.error} ({where}; {then})")
        return True
    error = res.error if not res.ok else f"run failed: {res.value.reason}"
    extra = {"run_id": res.value.run_id, "path": res.value.path} if res.ok else {}
    if unfetched(state.cell(name, res.host.name), res):
        state.update(name, res.host.name, error=error)  # still BENCHING: --resume fetches
        say(f"[sweep] {label(name)} on {res.host.name}: NOT FETCHED: {error}")
        return True
    state.update(name, res.host.name, status=CellStatus.FAILED, error=error, **extra)
    say(f"[sweep] {label(name)} on {res.host.name}: FAILED: {error}")
    return True


def unfetched(cell: Cell, res: Any) -> bool:
    """A cell whose run was started on the host and not fetched: the connection was lost
    (a run that failed there comes back as a result, not as a lost host)."""
    return (
        not res.ok and res.kind in LOST and cell.status == CellStatus.BENCHING and bool(cell.run_id)
    )


def _todo(state: SweepState, fleet: Fleet, name: str, head: str) -> Fleet:
    """The hosts this cell runs on now: not done there, no other cell's run waiting to be
    fetched from the host, and a node Slurm has not drained or downed (each said, one line;
    a drained node's reason kept on the cell for the report: control/sweep/drain.py)."""
    undone = fleet.only(h.name for h in fleet.hosts
                        if state.cell(name, h.name).status != CellStatus.DONE)  # fmt: skip
    held = _held(state, undone, name)
    for host, what in held.items():
        state.say(f"{head} on {host}: not started: the run of {what} is not fetched yet "
                  "(--resume fetches it first)")  # fmt: skip
    drained = drain.unavailable(undone.only(h for h in undone.names if h not in held))
    for host, why in drained.items():
        state.update(name, host, error=f"not started: Slurm has the node {why}")
        state.say(f"{head} on {host}: not started: Slurm has the node {why}; the sweep goes "
                  "on without it (--resume runs it there once Slurm gives it back)")  # fmt: skip
    return undone.only(h for h in undone.names if h not in held and h not in drained)


def _held(state: SweepState, fleet: Fleet, current: str) -> dict[str, str]:
    """Hosts with another cell's run not yet fetched, and that cell: no cell cleans them (a
    clean would kill the run's server and the finished results wait there)."""
    held = {}
    for key, cells in state.record.cells.items():
        for host, cell in cells.items():
            if key != current and host in fleet.names and cell.status == CellStatus.BENCHING:
                held.setdefault(host, f"{label(key)} (run {cell.run_id})")
    return held


@dataclass(frozen=True)
class SweepSetup:
    """What every cell of one sweep runs with: the hosts, the bench request, the launch
    options, whether a failed cell stops the rest, where lines and progress go, the cancel
    token (Ctrl-C) and the budget's hooks."""

    fleet: Fleet
    request: benchrun.BenchRequest
    launch: server.LaunchOptions
    say: Say
    fail_fast: bool = False
    progress: tuple[Any, Any] = (None, None)  # launch's and bench's progress displays
    cancel: CancelToken = dataclasses.field(default_factory=CancelToken)
    hooks: CellHooks = dataclasses.field(default_factory=CellHooks)


def run(state: SweepState, setup: SweepSetup) -> SweepState:
    """Run every cell, one at a time, all hosts in parallel."""
    fleet, say, cancel, hooks = setup.fleet, setup.say, setup.cancel, setup.hooks
    state.say = say
    arms = state.arms()
    for index, arm in enumerate(arms):
        name = arm.key
        if cancel.requested:
            break
        todo = _todo(state, fleet, name, f"[sweep {index + 1}/{len(arms)}] {name}")
        if not todo.hosts:
            say(f"[sweep {index + 1}/{len(arms)}] {name}: {_done_where(state, name, fleet)}")
            hooks.after(arm, state, False)
            continue
        why = hooks.drop(arm)
        if why is not None:
            for host in todo.names:
                state.update(name, host, status=CellStatus.DROPPED, error=None)
            say(f"[sweep {index + 1}/{len(arms)}] {name}: dropped by --budget ({why})")
            continue
        say(f"[sweep {index + 1}/{len(arms)}] {name} on {', '.join(todo.names)}"
            + _eta(state, len(arms) - index))  # fmt: skip
        started = time.monotonic()
        results = todo.each(lambda s, arm=arm: _pipeline(_cell(s, state, arm, setup)))
        failed = [_record(state, name, res) for res in results]
        state.record.durations_s[name] = round(time.monotonic() - started, 1)
        state.save()
        hooks.after(arm, state, True)
        if any(failed) and setup.fail_fast:
            say("[sweep] stopping: --fail-fast")
            break
    if state.as_root:
        say(server.run_as_note(sorted(state.as_root)))
    cells = [c for a in arms for c in state.record.cells[a.key].values()]
    if all(c.status in (CellStatus.DONE, CellStatus.DROPPED) for c in cells):
        state.record.status = SweepStatus.DONE
    else:
        state.record.status = (
            SweepStatus.INTERRUPTED if cancel.requested else SweepStatus.INCOMPLETE
        )
    state.save()
    return state


def _done_where(state: SweepState, name: str, fleet: Fleet) -> str:
    """What a cell with nothing to run now is: done on every host of the sweep, or not done
    on hosts this run cannot reach or may not clean yet (named above), never "done"."""
    left = [h for h in state.record.hosts if state.cell(name, h).status != CellStatus.DONE]
    if not left:
        return "already done, skipped"
    away = [h for h in left if h not in fleet.names]
    here = [h for h in left if h in fleet.names]
    said = [f"not done on {', '.join(away)} (not among the hosts here, see above)"] if away else []
    said += [f"not started on {', '.join(here)} (see above)"] if here else []
    return "; ".join(said) + "; nothing to run on the others"


def _eta(state: SweepState, profiles_left: int) -> str:
    done_times = list(state.record.durations_s.values())
    if not done_times:
        return ""
    return f", ~{(sum(done_times) / len(done_times)) * profiles_left:.0f}s left"


def report_input(state: SweepState, archive: Archive) -> ReportInput:
    """What the sweep's report shows: finished cells compared, failed cells listed."""
    return select.report_for_sweep(archive, state.path)
