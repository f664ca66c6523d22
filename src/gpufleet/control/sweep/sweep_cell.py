"""One cell of a sweep on one host (control/sweep/sweep_run.py runs the loop over cells):
gpu-clean -> launch -> bench -> stop, each step saved in the sweep state, and the resume of
a cell an interruption left: an archived run kept, a run still on the host re-attached or
fetched, anything else run again (docs/RELIABILITY.md, "Ctrl-C during a sweep")."""

from __future__ import annotations

import dataclasses
import functools
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from gpufleet.archive import store
from gpufleet.archive.kept import Cell, Manifest
from gpufleet.control.bench import run as benchrun
from gpufleet.control.connect.base import Session
from gpufleet.control.connect.cancel import Cancelled, CancelToken
from gpufleet.control.server import lifecycle as server
from gpufleet.control.server.gpuclean import (
    CleanOptions,
    clean_on,
    not_clean_error,
    verdict_lines,
)
from gpufleet.control.server.profiles import build_specs
from gpufleet.control.sweep.cells import ArmSpec, profile_label
from gpufleet.control.sweep.sweep_state import SweepState
from gpufleet.errors import HostError, UserError
from gpufleet.host.agent.protocol import BenchWatchArgs, StopArgs
from gpufleet.kinds import CellStatus, Kind, RunStatus
from gpufleet.records import LaunchSpec

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


class SweepCell:
    """One profile on one host: its state entry, its session and what it needs to run."""

    def __init__(
        self,
        session: Session,
        state: SweepState,
        arm: ArmSpec,
        request: benchrun.BenchRequest,
        *,
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
        """This cell's entry in the sweep state."""
        return self.state.cell(self.profile, self.host)

    def update(self, **fields: Any) -> None:
        """Save fields of this cell's entry."""
        self.state.update(self.profile, self.host, **fields)

    def phase(self, status: CellStatus) -> None:
        """Record and announce the step this cell enters."""
        self.update(status=status, steps_s=self.steps.seconds)
        self.state.say(f"[sweep] {label(self.profile)} on {self.host}: {status}")

    def archived_dir(self) -> Path | None:
        """The run this cell archived already, if its manifest is there."""
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
                return archived_result(manifest, archived)
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
                result = benchrun.fetch(self.session, run_id, self.request, progress=progress,
                                        cancel=self.cancel, resume=RESUME)  # fmt: skip
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
        """A fresh attempt: clean, launch, bench, stop (a stop asked between steps ends it
        cleanly)."""
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
        """Launch this cell's server and wait until it serves."""
        launched = server.launch_on(
            self.session, self.spec, self.launch_options, self.launch_progress, self.cancel
        )
        if server.runs_as_root_unasked(self.session.host, launched.state):
            with self.state.lock:  # said once, after the sweep (cells run side by side)
                self.state.as_root.add(self.host)

    def bench(self) -> benchrun.ArchivedRun:
        """Start the benchmark, fetch and archive it, then stop the server."""
        run_id = benchrun.make_run_id(self.request, [self.host])
        self.update(status=CellStatus.BENCHING, run_id=run_id, steps_s=self.steps.seconds)
        started = False
        try:
            benchrun.start(self.session, self.request, run_id, self.bench_progress)
            started = True
            result = benchrun.fetch(
                self.session, run_id, self.request,
                progress=self.bench_progress, cancel=self.cancel, resume=RESUME,
            )  # fmt: skip
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


def archived_result(manifest: Manifest, path: Path) -> benchrun.ArchivedRun:
    """An archived run as the sweep records it."""
    return benchrun.ArchivedRun(manifest.run_id, str(path), manifest.status, manifest.reason)


LOST = (Kind.CONNECTION, Kind.AGENT)  # the control side lost the host, not the run
# the one recovery a cell's lost run names: the sweep's own resume line (printed at its end),
# never an `inv bench --attach` beside it that would archive the run a second time (81.7)
RESUME = "the sweep's --resume fetches it (never measures it again)"
