"""Bench verbs: start a detached run, run it, watch it. Runs survive a dropped SSH session.

bench-start  writes plan.json, spawns `agent.pyz bench-run` in its own session, returns
bench-run    the detached runner (gpufleet.host.bench.runner) plus host facts and NVML snapshots
bench-watch  streams progress.jsonl until status.json says done or failed; lists the files
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from gpufleet.host.agent import childenv, safewrite
from gpufleet.host.agent.procstat import ProcRef
from gpufleet.host.agent.protocol import (
    AgentError,
    BenchRunArgs,
    BenchStartAnswer,
    BenchStartArgs,
    BenchWatchAnswer,
    BenchWatchArgs,
    RunStatusFile,
    emit_event,
)
from gpufleet.host.gpu import facts as gpus
from gpufleet.host.gpu import nvml as nvmlread
from gpufleet.host.proc import jobstep
from gpufleet.host.server import keys as serverkeys
from gpufleet.host.server.state import all_states, read_state, server_alive, tail
from gpufleet.kinds import Kind, RunStatus
from gpufleet.records import BenchPlan, ServerState
from gpufleet.wire import JsonObject

RUNS = Path("runs")


def _run_dir(run_id: str) -> Path:
    if not run_id or "/" in run_id or run_id.startswith("."):
        raise AgentError(f"bad run id {run_id!r}", kind=Kind.BAD_INPUT)
    return RUNS / run_id


def _pick_server(port: int | None, profile: str | None) -> ServerState | None:
    states = [s for s in all_states() if server_alive(s)]
    if port is not None:
        states = [s for s in states if s.port == port]
    if profile:
        states = [s for s in states if s.profile == profile]
    return max(states, key=lambda s: s.started_at) if states else None


def bench_start(args: BenchStartArgs) -> BenchStartAnswer:
    plan = args.plan
    if plan is None:
        raise AgentError("bench-start: missing argument 'plan'", kind=Kind.BAD_INPUT)
    run_dir = _run_dir(plan.run_id)
    if run_dir.exists():
        raise AgentError(f"run {plan.run_id} already exists on this host", kind=Kind.EXISTS)
    state = None
    if not plan.base_url:
        state = _pick_server(plan.port, plan.profile)
        if state is None:
            what = f"profile {plan.profile}" if plan.profile else "any profile"
            where = f" on port {plan.port}" if plan.port else ""
            raise AgentError(
                f"no running server of {what}{where} (inv launch first)", kind=Kind.NO_SERVER
            )
        plan.base_url = state.health_url.rsplit("/", 1)[0]
        plan.server_port = state.port
        plan.profile = plan.profile or state.profile
    if plan.metrics:
        plan.metrics_url = plan.base_url + "/metrics"
    safewrite.own_dir(run_dir.parent)
    os.mkdir(run_dir, 0o700)
    incoming = Path(args.prompts_file)
    os.replace(incoming, run_dir / "prompts.jsonl")
    safewrite.write_atomic(run_dir / "plan.json", plan.to_json())
    safewrite.write_atomic(run_dir / "status.json", json.dumps({"status": RunStatus.STARTING}))
    runner = _spawn_runner(
        run_dir,
        BenchRunArgs(args.host, args.expected_gpus, args.sim, run_id=plan.run_id),
        jobstep.JobStep.of(args.slurm_job, args.slurm_node),
    )
    safewrite.write_atomic(run_dir / "runner.json", json.dumps(runner.to_wire()))
    return {
        "run_id": plan.run_id,
        "run_dir": str(run_dir.resolve()),
        "pid": runner.pid,
        "base_url": plan.base_url,
        "profile": plan.profile,
        "slots": state.slots if state else None,
        "engine": state.engine if state else None,
    }


def _spawn_runner(run_dir: Path, args: BenchRunArgs, step: jobstep.JobStep | None) -> ProcRef:
    """`agent.pyz bench-run` in its own session (survives SSH), its arguments on stdin;
    inside a Slurm job, a step of that job (it survives the agent's step, as the server
    does, and ends with the job)."""
    agent = os.path.abspath(sys.argv[0])
    argv = [sys.executable, "-I", agent, BenchRunArgs.VERB]
    with safewrite.open_append(run_dir / "runner.log") as log:
        if step is not None:
            wire = run_dir / "runner-args.json"
            safewrite.write_atomic(wire, args.to_wire())
            env = jobstep.srun_env(childenv.child_env())
            try:
                pid = jobstep.spawn(
                    step, argv, env, log, run_dir / "runner.log", run_dir / "runner.pid", wire
                )
            except jobstep.StepNotStarted as exc:
                said = " | ".join(tail(str(run_dir / "runner.log"), 3))
                raise AgentError(f"bench runner: {exc}: {said}", kind=Kind.RUN_FAILED) from None
            return ProcRef.capture(pid) or ProcRef(pid, -1)
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
            env=childenv.child_env(),
        )
    assert proc.stdin is not None
    proc.stdin.write(args.to_wire().encode())
    proc.stdin.close()
    return ProcRef.capture(proc.pid) or ProcRef(proc.pid, -1)


def _nvml_snapshot() -> list[JsonObject] | None:
    """What nvml_before.json and nvml_after.json hold: each GPU's reading (None: no NVML)."""
    try:
        return [gpu.to_wire() for gpu in nvmlread.snapshot(nvmlread.load_pynvml())]
    except AgentError:
        return None


def bench_run(args: BenchRunArgs) -> RunStatusFile:
    from gpufleet.host.bench.runner import run_plan

    run_dir = _run_dir(args.run_id)
    plan = BenchPlan.from_wire(json.loads((run_dir / "plan.json").read_text()), "plan.json")
    state = read_state(plan.server_port) if plan.server_port else None
    facts = {"sysinfo.json": gpus.sysinfo(args).to_wire(), "nvml_before.json": _nvml_snapshot()}
    try:
        return run_plan(
            run_dir,
            state,
            facts,
            finish=lambda writer: writer.json("nvml_after.json", _nvml_snapshot()),
            keys=serverkeys.read(state.key_file if state else None),
        )
    except Exception as exc:
        failed = {"status": RunStatus.FAILED, "reason": f"runner crashed: {exc!r}"}
        safewrite.write_atomic(run_dir / "status.json", json.dumps(failed))
        raise


def _runner_alive(run_dir: Path) -> bool:
    try:
        return ProcRef.from_wire(json.loads((run_dir / "runner.json").read_text())).alive()
    except (OSError, ValueError, KeyError):
        return False


def _emit_progress(run_dir: Path, offset: int) -> int:
    """Emit the complete progress lines written since `offset`; the new offset."""
    try:
        with open(run_dir / "progress.jsonl", "rb") as fh:
            fh.seek(offset)
            data = fh.read()
    except OSError:
        return offset
    complete = data[: data.rfind(b"\n") + 1]
    for line in complete.decode(errors="replace").splitlines():
        try:
            emit_event(json.loads(line))
        except ValueError:
            continue
    return offset + len(complete)


def _read_status(run_dir: Path) -> RunStatusFile:
    try:
        return json.loads((run_dir / "status.json").read_text())
    except (OSError, ValueError):
        return {"status": RunStatus.STARTING}


def bench_watch(args: BenchWatchArgs) -> BenchWatchAnswer:
    """Stream progress until the run ends, or until `timeout_s` passes ("watching": call
    again with the returned offset; the control plane watches in slices so it can stop
    watching at any time without touching the run)."""
    run_dir = _run_dir(args.run_id)
    if not run_dir.exists():
        raise AgentError(f"no run {args.run_id} on this host", kind=Kind.NO_RUN)
    offset = args.offset
    deadline = time.monotonic() + args.timeout_s
    while True:
        offset = _emit_progress(run_dir, offset)
        status = _read_status(run_dir)
        if status["status"] in (RunStatus.DONE, RunStatus.FAILED):
            break
        if status["status"] in (RunStatus.STARTING, RunStatus.RUNNING) and not _runner_alive(
            run_dir
        ):
            time.sleep(0.5)  # it may have just written its last status
            status = _read_status(run_dir)
            if status["status"] not in (RunStatus.DONE, RunStatus.FAILED):
                log_tail = tail(str(run_dir / "runner.log"), 20)
                status = {
                    "status": RunStatus.FAILED,
                    "reason": "the bench runner died",
                    "tail": log_tail,
                }
                safewrite.write_atomic(run_dir / "status.json", json.dumps(status))
            break
        if time.monotonic() > deadline:
            return {
                "status": RunStatus.WATCHING,
                "reason": None,
                "files": [],
                "run_dir": str(run_dir.resolve()),
                "tail": None,
                "offset": offset,
            }
        time.sleep(0.25)
    offset = _emit_progress(run_dir, offset)
    files = [
        {"name": p.name, "size": p.stat().st_size}
        for p in sorted(run_dir.iterdir())
        if p.is_file() and not p.name.startswith(".")
    ]
    return {
        "status": status["status"],
        "reason": status.get("reason"),
        "files": files,
        "run_dir": str(run_dir.resolve()),
        "tail": status.get("tail"),
        "offset": offset,
    }
