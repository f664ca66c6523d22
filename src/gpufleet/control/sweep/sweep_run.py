"""inv sweep: for each cell (a profile, at a point of its flag grid, per repeat: see
control/sweep/cells.py), on all hosts in parallel, gpu-clean -> launch -> bench -> stop -> verify
clean; then compare. State is saved after every step so `--resume` finishes an interrupted
sweep without redoing what succeeded.

Interruption (docs/RELIABILITY.md, "Ctrl-C during a sweep"): once a stop is asked (the
cancel token), no new cell starts. A cell still cleaning, launching or waiting for health
is cancelled cleanly (its server stopped) and `--resume` runs it again; a cell whose
benchmark has started keeps running on the host and `--resume` re-attaches, archives it
and stops the server; a cell that is stopping finishes stopping. `--resume` re-runs every
cell whose archived run failed (the failed archive stays, marked superseded).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gpufleet.archive import store
from gpufleet.archive.kept import Cell, Manifest
from gpufleet.archive.layout import Archive
from gpufleet.control.bench import run as benchrun
from gpufleet.control.connect.base import Session
from gpufleet.control.connect.cancel import Cancelled, CancelToken
from gpufleet.control.connect.fleet import Fleet
from gpufleet.control.server import lifecycle as server
from gpufleet.control.server.gpuclean import (
    CleanOptions,
    clean_on,
    not_clean_error,
    verdict_lines,
)
from gpufleet.control.server.profiles import build_specs
from gpufleet.control.sweep import drain
from gpufleet.control.sweep.cells import ArmSpec, profile_label
from gpufleet.control.sweep.sweep_state import Say, SweepState
from gpufleet.errors import HostError, UserError
from gpufleet.host.agent.protocol import BenchWatchArgs, StopArgs
from gpufleet.kinds import CellStatus, Kind, RunStatus, SweepStatus
from gpufleet.records import LaunchSpec
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


label = profile_label  # a cell key reads as is; a profile path by its file name


class _Steps:
    """Where one cell's time went (clean, launch, bench, stop), kept in the sweep state."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.mark = time.monotonic()

    def done(self, step: str) -> None:
        now = time.monotonic()
        self.seconds[step] = round(now - self.mark, 2)
        self.mark = now


def cell_request(
    request: benchrun.BenchRequest, arm: ArmSpec, launch: server.LaunchOptions
) -> benchrun.BenchRequest:
    """A cell's bench request: named by the cell's label, with the cell's engine (--engine's,
    else its resolved profile's), since a label (`llama[depth=1]`) is no profile file to
    read the engine's dialect and cache facts from."""
    engine = launch.engine or arm.resolved_profile().engine
    return replace(request, profile=arm.label, server_engine=engine)


class _Cell:
    """One profile on one host: its state entry, its session and what it needs to run."""

    def __init__(
        self,
        session: Session,
        state: SweepState,
        arm: ArmSpec,
        request: benchrun.BenchRequest,
        launch: server.LaunchOptions,
        cancel: CancelToken,
        progress: tuple[Any, Any],
    ) -> None:
        self.session = session
        self.state = state
        self.arm = arm
        self.profile = arm.key  # the cell's key in the sweep state
        self.host = session.host.name
        self.request = cell_request(request, arm, launch)
        self.launch_options = dataclasses.replace(launch, replace=True)
        self.engine = launch.engine
        self.cancel = cancel
        self.launch_progress, self.bench_progress = progress
        self.steps = _Steps()
        self.stop_on_interrupt = False  # CellHooks.stop_on_interrupt

    @property
    def entry(self) -> Cell:
        return self.state.cell(self.profile, self.host)

    def update(self, **fields: Any) -> None:
        self.state.update(self.profile, self.host, **fields)

    def phase(self, status: CellStatus) -> None:
        """Record and announce the step this cell enters."""
        self.update(status=status, steps_s=self.steps.seconds)
        self.state.say(f"[sweep] {label(self.profile)} on {self.host}: {status}")

    def archived_dir(self) -> Path | None:
        run_id = self.entry.run_id
        path = self.request.archive.run_dir(self.host, str(run_id))
        return path if run_id and (path / "manifest.json").exists() else None

    # -- resuming what an interruption left ---------------------------------------------
    def resume(self) -> benchrun.ArchivedRun | None:
        """The cell's result if an earlier attempt can be finished; None to run it again."""
        archived = self.archived_dir()
        if archived is not None:
            manifest = store.read_manifest(archived)
            if manifest.status == RunStatus.DONE:
                self.stop_server()  # archived just before an interruption
                return _archived_result(manifest, archived)
            store.mark_superseded(archived, f"re-run by sweep {self.state.sweep_id}")
            return None
        run_id = self.entry.run_id
        finished = self.entry.status == CellStatus.FAILED and self.finished_there(run_id)
        if (self.entry.status == CellStatus.BENCHING or finished) and run_id:
            said = "its run finished there before it was fetched: fetching" if finished else (
                "re-attaching")  # fmt: skip
            self.state.say(f"[sweep] {label(self.profile)} on {self.host}: {said} run {run_id}")
            progress = None if finished else self.bench_progress  # nothing live to replay
            try:  # the run went on on the host: re-attach and archive it
                result = benchrun.fetch(self.session, run_id, self.request,
                                        progress, self.cancel, RESUME)  # fmt: skip
            except HostError as exc:
                if exc.kind in LOST:  # still out of reach: the run stays the host's
                    raise HostError(f"{exc} (run {run_id} stays on the host)",
                                    kind=Kind.CONNECTION) from None  # fmt: skip
                return None  # not on the host any more: run the cell again
            except UserError:
                return None
            self.update(status=CellStatus.ARCHIVED, path=result.path)
            self.stop_server()
            return result
        return None

    def finished_there(self, run_id: str | None) -> bool:
        """Whether a failed cell's run (never archived) finished on the host after all: its
        job ended before the sweep had its files, unseen (issue 81.7). Asked quietly, once."""
        if not run_id or self.archived_dir() is not None:
            return False
        try:
            answer = self.session.call(BenchWatchArgs(run_id=run_id, timeout_s=0.0))
        except (HostError, UserError):
            return False
        return answer["status"] == RunStatus.DONE

    # -- a fresh attempt -------------------------------------------------------------
    def run(self) -> benchrun.ArchivedRun:
        self.cancel.check("starting the cell")
        self.update(run_id=None, path=None, error=None)
        self.phase(CellStatus.CLEANING)
        cleaned = clean_on(self.session, CleanOptions(grace_s=5))
        for _, text in verdict_lines(cleaned.gpus):
            self.state.say(f"[sweep] {label(self.profile)} on {self.host}: {text}")
        if not cleaned.clean:
            raise not_clean_error(cleaned)
        self.steps.done("clean")
        self.cancel_cleanly_if_asked("before launching", server=False)
        self.phase(CellStatus.LAUNCHING)
        try:
            self.launch()
        except Cancelled:
            self.cancel_cleanly_if_asked("waiting for the server", server=True)
            raise
        except BaseException:
            self.stop_server()
            raise
        self.steps.done("launch")
        self.cancel_cleanly_if_asked("before the benchmark", server=True)
        return self.bench()

    @functools.cached_property
    def spec(self) -> LaunchSpec:
        """What this cell launches on its host (its port is the one server it may stop)."""
        [(_, spec)] = build_specs(self.arm.resolved_profile(), [self.session.host], self.engine)
        return spec

    def launch(self) -> None:
        launched = server.launch_on(
            self.session, self.spec, self.launch_options, self.launch_progress, self.cancel
        )
        if server.runs_as_root_unasked(self.session.host, launched.state):
            with self.state.lock:  # said once, after the sweep (cells run side by side)
                self.state.as_root.add(self.host)

    def bench(self) -> benchrun.ArchivedRun:
        run_id = benchrun.make_run_id(self.request, [self.host])
        self.update(status=CellStatus.BENCHING, run_id=run_id, steps_s=self.steps.seconds)
        started = False
        try:
            benchrun.start(self.session, self.request, run_id, self.bench_progress)
            started = True
            result = benchrun.fetch(
                self.session, run_id, self.request, self.bench_progress, self.cancel, RESUME
            )
        except Cancelled:
            if self.stop_on_interrupt:  # the task's own server: stopped, the run with it
                self.stop_server()
                self.update(status=CellStatus.INTERRUPTED, steps_s=self.steps.seconds)
            raise  # else the run goes on on the host, and its server with it: --resume fetches
        except HostError as exc:
            if started and exc.kind in LOST:  # the run is the host's: fetched, never re-run
                raise HostError(
                    f"{exc}; run {run_id} stays on the host, and this host runs no other "
                    "cell until it is fetched", kind=Kind.CONNECTION,
                ) from None  # fmt: skip
            if exc.kind != Kind.JOB_ENDED:  # ended with its job: nothing to stop, and
                self.stop_server()  # --resume measures the cell again
            raise
        except BaseException:
            self.stop_server()
            raise
        self.steps.done("bench")
        self.update(status=CellStatus.ARCHIVED, path=result.path)
        self.phase(CellStatus.STOPPING)
        self.stop_server()
        self.steps.done("stop")
        self.update(steps_s=self.steps.seconds)
        return result

    def cancel_cleanly_if_asked(self, doing: str, server: bool) -> None:
        """On a stop request: stop this cell's server (if launched), mark it interrupted."""
        if not self.cancel.requested:
            return
        if server:
            self.stop_server()
        self.update(status=CellStatus.INTERRUPTED, steps_s=self.steps.seconds)
        raise Cancelled(doing)

    def stop_server(self) -> None:
        """Stop this cell's own server (its port): another server on the host's other GPUs
        is someone else's and lives on."""
        stop = StopArgs(port=self.spec.port, grace_s=10, timeout_s=60)
        result = self.session.call(stop, timeout=180)
        verify = result.verify
        if verify and not verify.clean:
            raise HostError("GPUs not clean after stopping the server", kind=Kind.NOT_CLEAN)


def _archived_result(manifest: Manifest, path: Path) -> benchrun.ArchivedRun:
    return benchrun.ArchivedRun(manifest.run_id, str(path), manifest.status, manifest.reason)


def _cell(session: Session, state: SweepState, arm: ArmSpec, setup: SweepSetup) -> _Cell:
    cell = _Cell(session, state, arm, setup.request, setup.launch, setup.cancel, setup.progress)
    cell.stop_on_interrupt = setup.hooks.stop_on_interrupt
    return cell


def _pipeline(cell: _Cell) -> benchrun.ArchivedRun:
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


LOST = (Kind.CONNECTION, Kind.AGENT)  # the control side lost the host, not the run
# the one recovery a cell's lost run names: the sweep's own resume line (printed at its end),
# never an `inv bench --attach` beside it that would archive the run a second time (81.7)
RESUME = "the sweep's --resume fetches it (never measures it again)"


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
