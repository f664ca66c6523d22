"""inv sweep: for each profile, on all hosts in parallel, gpu-clean -> launch -> bench -> stop
-> verify clean; then compare. State is saved after every step so `--resume` finishes an
interrupted sweep without redoing what is archived (a bench still running on a host is
re-attached, not restarted).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpufleet.archive import select
from gpufleet.control import bench as benchrun
from gpufleet.control import lifecycle as server
from gpufleet.control.fanout import run_on_hosts
from gpufleet.control.gpuclean import CleanOptions, clean_on
from gpufleet.control.inventory import Host
from gpufleet.control.playbook import build_specs, load_profile
from gpufleet.control.transport import Session
from gpufleet.errors import HostError, UserError
from gpufleet.host.protocol import StopArgs
from gpufleet.report.compare import Arm

Say = Callable[[str], None]


class SweepState:
    """The sweep's progress on disk (written atomically after every change)."""

    def __init__(self, path: Path, data: dict[str, Any]) -> None:
        self.path = path
        self.data = data
        self.lock = threading.Lock()

    @classmethod
    def new(
        cls, root: Path, profiles: list[str], hosts: list[str], levels: list[int]
    ) -> SweepState:
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        sweep_id = f"{stamp}-{'-vs-'.join(Path(p).stem for p in profiles)}"
        data = {
            "sweep_id": sweep_id,
            "profiles": profiles,
            "hosts": hosts,
            "concurrency": levels,
            "created_at": datetime.now(UTC).isoformat(),
            "status": "running",
            "cells": {p: {h: {"status": "pending"} for h in hosts} for p in profiles},
            "durations_s": {},
        }
        state = cls(root / "sweeps" / f"{sweep_id}.json", data)
        state.save()
        return state

    @classmethod
    def latest(cls, root: Path, profiles: list[str]) -> SweepState:
        candidates = sorted((root / "sweeps").glob("*.json"))
        for path in reversed(candidates):
            data = json.loads(path.read_text())
            if data["profiles"] == profiles and data["status"] != "done":
                return cls(path, data)
        raise UserError(
            f"--resume: no unfinished sweep of {','.join(profiles)} under {root / 'sweeps'}/"
        )

    def save(self) -> None:
        with self.lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(self.data, indent=2))
            os.replace(tmp, self.path)

    def cell(self, profile: str, host: str) -> dict[str, Any]:
        return self.data["cells"][profile][host]

    def update(self, profile: str, host: str, **fields: Any) -> None:
        with self.lock:
            self.data["cells"][profile][host].update(fields)
        self.save()


def label(profile: str) -> str:
    """A profile given as a path is shown by its file name."""
    return Path(profile).stem if profile.endswith((".yaml", ".yml")) else profile


def plan_lines(
    profiles: list[str], hosts: list[Host], request: benchrun.BenchRequest, engine: str | None
) -> list[str]:
    lines = []
    for name in profiles:
        prof = load_profile(name)
        engines = {spec.engine for _, spec in build_specs(prof, hosts, engine)}
        levels = ", ".join(
            f"C={lv['concurrency']} x {lv['num_prompts']}" for lv in request.levels()
        )
        lines.append(
            f"{prof.name} ({'/'.join(sorted(engines))}) on {', '.join(h.name for h in hosts)}:"
            f" gpu-clean -> launch -> bench [{levels}; {request.output_len} tokens each]"
            " -> stop -> verify clean"
        )
        lines += [f"  warning: {w}" for w in prof.warnings()]
    return lines


def _pipeline(
    session: Session,
    state: SweepState,
    profile_name: str,
    request: benchrun.BenchRequest,
    engine: str | None,
    launch_progress: Any,
    bench_progress: Any,
) -> dict[str, Any]:
    host = session.host
    cell = state.cell(profile_name, host.name)
    prof = load_profile(profile_name)
    req = replace(request, profile=profile_name)
    archived = request.archive_root / host.name / str(cell.get("run_id"))
    if cell.get("run_id") and (archived / "manifest.json").exists():
        # archived before an interruption: nothing to redo but the stop
        manifest = json.loads((archived / "manifest.json").read_text())
        _stop(session)
        return {
            "status": manifest["status"],
            "reason": manifest.get("reason"),
            "run_id": cell["run_id"],
            "path": str(archived),
            "results": [],
            "tail": [],
        }
    if cell.get("status") == "benching" and cell.get("run_id"):
        try:  # interrupted while benchmarking: the run went on on the host; fetch it
            result = benchrun.fetch(session, cell["run_id"], req, bench_progress)
            _stop(session)
            return result
        except (HostError, UserError):
            pass  # not fetchable (already archived, or lost): run it again
    steps: dict[str, float] = {}  # where this cell's time went, kept in the sweep state
    mark = time.monotonic()

    def step_done(step: str) -> None:
        nonlocal mark
        now = time.monotonic()
        steps[step] = round(now - mark, 2)
        mark = now

    state.update(profile_name, host.name, status="cleaning")
    cleaned = clean_on(session, CleanOptions(grace_s=5))
    if not cleaned["clean"]:
        raise HostError("gpu-clean before launch did not verify clean", kind="not_clean")
    step_done("clean")
    state.update(profile_name, host.name, status="launching", steps_s=steps)
    [(_, spec)] = build_specs(prof, [host], engine)
    server.launch_on(
        session, spec, server.LaunchOptions(replace=True, engine=engine), launch_progress
    )
    step_done("launch")
    run_id = benchrun.make_run_id(req, [host.name])
    state.update(profile_name, host.name, status="benching", run_id=run_id, steps_s=steps)
    try:
        result = benchrun.bench_on(session, req, run_id, bench_progress)
        step_done("bench")
        state.update(profile_name, host.name, status="archived", path=result["path"])
    finally:
        _stop(session)
        step_done("stop")
        state.update(profile_name, host.name, steps_s=steps)
    return result


def _stop(session: Session) -> None:
    result = session.call(StopArgs(grace_s=10, timeout_s=60), timeout=180)
    verify = result.get("verify")
    if verify and not verify["clean"]:
        raise HostError("GPUs not clean after stopping the server", kind="not_clean")


def run(
    state: SweepState,
    hosts: list[Host],
    request: benchrun.BenchRequest,
    engine: str | None,
    fail_fast: bool,
    forks: int,
    say: Say,
    launch_progress: Any = None,
    bench_progress: Any = None,
) -> SweepState:
    profiles = state.data["profiles"]
    for index, name in enumerate(profiles):
        todo = [h for h in hosts if state.cell(name, h.name)["status"] != "done"]
        if not todo:
            say(f"[sweep {index + 1}/{len(profiles)}] {label(name)}: already done, skipped")
            continue
        done_times = list(state.data["durations_s"].values())
        eta = ""
        if done_times:
            left = (sum(done_times) / len(done_times)) * (len(profiles) - index)
            eta = f", ~{left:.0f}s left"
        say(f"[sweep {index + 1}/{len(profiles)}] {name} on {', '.join(h.name for h in todo)}{eta}")
        started = time.monotonic()
        results = run_on_hosts(
            todo,
            lambda s, name=name: _pipeline(
                s, state, name, request, engine, launch_progress, bench_progress
            ),
            forks=forks,
        )
        failed = False
        for res in results:
            if res.ok and res.value["status"] == "done":
                state.update(
                    name,
                    res.host.name,
                    status="done",
                    run_id=res.value["run_id"],
                    path=res.value["path"],
                    error=None,
                )
                steps = state.cell(name, res.host.name).get("steps_s") or {}
                took = ", ".join(f"{k} {v:.1f}s" for k, v in steps.items())
                say(
                    f"[sweep] {label(name)} on {res.host.name}: done"
                    + (f" ({took})" if took else "")
                    + f", archived {res.value['path']}"
                )
            else:
                error = res.error if not res.ok else f"run failed: {res.value['reason']}"
                extra = {"run_id": res.value["run_id"], "path": res.value["path"]} if res.ok else {}
                state.update(name, res.host.name, status="failed", error=error, **extra)
                say(f"[sweep] {label(name)} on {res.host.name}: FAILED: {error}")
                failed = True
        state.data["durations_s"][name] = round(time.monotonic() - started, 1)
        state.save()
        if failed and fail_fast:
            say("[sweep] stopping: --fail-fast")
            break
    cells = [c for p in profiles for c in state.data["cells"][p].values()]
    state.data["status"] = "done" if all(c["status"] == "done" for c in cells) else "incomplete"
    state.save()
    return state


def check_profiles(names: list[str]) -> None:
    """Every profile loads (UserError otherwise), before anything starts."""
    if not names:
        raise UserError("--profiles needs at least one profile (e.g. baseline,eagle3)")
    for name in names:
        load_profile(name)


def open_state(
    root: Path, profiles: list[str], hosts: list[Host], levels: list[int], resume: bool
) -> SweepState:
    """The latest unfinished sweep of these profiles (--resume), or a new one."""
    if resume:
        return SweepState.latest(root, profiles)
    return SweepState.new(root, profiles, [h.name for h in hosts], levels)


def hosts_of(state: SweepState, selected: list[Host]) -> list[Host]:
    """The selected hosts that belong to this sweep (a resumed sweep keeps its hosts)."""
    return [h for h in selected if h.name in state.data["hosts"]]


def finished_arms(state: SweepState, root: Path) -> dict[str, list[Arm]]:
    """host -> arms of the finished cells, when at least two profiles finished."""
    finished = {p: r for p, r in run_ids(state).items() if r}
    return select.from_run_ids(root, finished) if len(finished) >= 2 else {}


def run_ids(state: SweepState) -> dict[str, dict[str, str]]:
    """profile -> host -> run id, for the cells that finished."""
    return {
        p: {h: c["run_id"] for h, c in hosts.items() if c["status"] == "done"}
        for p, hosts in state.data["cells"].items()
    }
