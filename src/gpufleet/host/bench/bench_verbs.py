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
from typing import IO

from gpufleet.host.agent import bounded, childenv, jobdeadline, ownership, runas, safewrite
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
from gpufleet.host.bench import jobend, userrun
from gpufleet.host.bench.rundir import LOG_FD_ENV
from gpufleet.host.gpu import facts as gpus
from gpufleet.host.gpu import nvml as nvmlread
from gpufleet.host.proc import jobstep
from gpufleet.host.server import keys as serverkeys
from gpufleet.host.server import listener
from gpufleet.host.server.state import all_states, read_state, server_alive, tail
from gpufleet.kinds import Kind, RunStatus
from gpufleet.records import BenchPlan, ServerState
from gpufleet.wire import JsonDict

RUNS = Path("runs")
# handed to a runner that runs as the run_as user, in its run directory (hidden: never
# taken back into the archive)
HANDED_STATE = ".server.json"
HANDED_KEYS = ".keys.json"
OWNER_SOCKET = ".owner.sock"  # where a runner in a job step takes the host's lock


def _run_dir(run_id: str) -> Path:
    """The run's own directory; one line where something else sits at its name (a link
    root would follow, listing and handing over another directory's files: issue 68.5)."""
    if not run_id or "/" in run_id or run_id.startswith("."):
        raise AgentError(f"bad run id {run_id!r}", kind=Kind.BAD_INPUT)
    path = RUNS / run_id
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        what = f"a link to {os.readlink(path)}" if path.is_symlink() else "not a directory"
        raise AgentError(f"run {run_id}: {path} is {what}, not gpufleet's run directory: "
                         "refused, nothing read (remove it)", kind=Kind.UNTRUSTED)  # fmt: skip
    if path.exists():
        safewrite.own_dir(path)  # root's own, written by nobody else, or refused
    return path


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
        refused = listener.refusal_for(state)  # benched is the server gpufleet launched
        if refused:
            raise AgentError(refused, kind=Kind.UNTRUSTED)
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
    run_args = BenchRunArgs(args.host, args.expected_gpus, args.sim, run_id=plan.run_id)
    user = runas.resolve(args.run_as)
    step = jobstep.JobStep.of(args.slurm_job, args.slurm_node, "bench")
    if user is not None and step is None:
        ends = jobdeadline.job_end(jobend.deadline_of(plan, run_dir / "prompts.jsonl"))
        runner = _spawn_runner_as(user, run_dir, run_args, state or _state_of(plan), ends)
    else:  # in a Slurm job the runner runs as the job's user, as the server does
        runner = _spawn_runner(run_dir, run_args, step)
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
            return _spawn_step(run_dir, args, step, argv, log)
        held = ownership.held_fd()  # the run owns the host until it ends, task or not
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
            pass_fds=() if held is None else (held,),
            env=childenv.child_env(),
        )
    assert proc.stdin is not None
    proc.stdin.write(args.to_wire().encode())
    proc.stdin.close()
    return ProcRef.capture(proc.pid) or ProcRef(proc.pid, -1)


def _spawn_step(
    run_dir: Path, args: BenchRunArgs, step: jobstep.JobStep, argv: list[str], log: IO[bytes]
) -> ProcRef:
    """The runner as a step of the job, handed the host's lock over a socket in its run
    directory before bench-start answers (no child of the agent inherits it: issue 81.6)."""
    wire = run_dir / "runner-args.json"
    safewrite.write_atomic(wire, args.to_wire())
    env = jobstep.srun_env(childenv.child_env())
    listener = ownership.hand_over(run_dir / OWNER_SOCKET)
    try:
        pid = jobstep.spawn(
            step,
            argv,
            env,
            log,
            log=run_dir / "runner.log",
            pid_file=run_dir / "runner.pid",
            stdin_file=wire,
        )
    except jobstep.StepNotStarted as exc:
        if listener is not None:
            ownership.give(listener, run_dir / OWNER_SOCKET, within=0)  # closed, removed
        said = " | ".join(tail(str(run_dir / "runner.log"), 3))
        raise AgentError(f"bench runner: {exc}: {said}", kind=Kind.RUN_FAILED) from None
    if listener is not None:
        ownership.give(listener, run_dir / OWNER_SOCKET)
    return ProcRef.capture(pid) or ProcRef(pid, -1)


def _state_of(plan: BenchPlan) -> ServerState | None:
    return read_state(plan.server_port) if plan.server_port else None


def _spawn_runner_as(
    user: runas.RunAs, run_dir: Path, args: BenchRunArgs, state: ServerState | None,
    ends: jobdeadline.JobEnd,
) -> ProcRef:  # fmt: skip
    """The runner as the run_as user, in its own directory, with what it needs of root's
    handed to it: its inputs as its own files, the server's log as a descriptor
    (host/bench/userrun.py). It cannot read root's simulated GPUs: its NVML figures are
    the user's own view (none on a rehearsal host). It holds the host until it ends or
    its job's end `ends` passes (host/agent/ownership.py)."""
    files: dict[str, str | bytes] = {
        "plan.json": (run_dir / "plan.json").read_text(),
        "prompts.jsonl": (run_dir / "prompts.jsonl").read_bytes(),
        "status.json": json.dumps({"status": RunStatus.STARTING}),
        HANDED_KEYS: json.dumps(serverkeys.read(state.key_file if state else None)),
    }
    if state is not None:
        files[HANDED_STATE] = json.dumps(state.to_wire())
    home = userrun.hand_over(user, run_dir, files)
    args.sim = None
    env = user.env(childenv.child_env())
    log_fd = _open_server_log(state)
    if log_fd is not None:
        env[LOG_FD_ENV] = str(log_fd)
    if state is not None:  # root's server: its descriptors are not the runner's to read
        env[listener.SOCKETS_ENV] = listener.sockets_of(state)
    fds = () if log_fd is None else (log_fd,)  # never root's lock: ownership.keep_for
    try:
        proc = _start_as(user, home, env, run_dir, fds)
    finally:
        if log_fd is not None:
            os.close(log_fd)
    runner = ProcRef.capture(proc.pid)
    if runner is not None:  # the run owns the host until it ends, task or not
        ownership.keep_for(runner, user.name, ends=ends, run=run_dir.name)
    assert proc.stdin is not None
    proc.stdin.write(args.to_wire().encode())
    proc.stdin.close()
    return runner or ProcRef(proc.pid, -1)


def _start_as(
    user: runas.RunAs, home: Path, env: dict[str, str], run_dir: Path, fds: tuple[int, ...]
) -> subprocess.Popen:
    """The runner needs the standard library only: the agent's interpreter where the user
    may run it, else the system's (the agent's may sit where the user cannot reach)."""
    said = ""
    for python in runas.pythons():
        try:
            with safewrite.open_append(run_dir / "runner.log") as log:
                return subprocess.Popen(
                    [python, "-I", str(home / "agent.pyz"), BenchRunArgs.VERB],
                    stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT, env=env,
                    start_new_session=True, close_fds=True, pass_fds=fds,
                    **{**user.popen(), "cwd": str(home)},  # type: ignore[arg-type]
                )  # fmt: skip
        except OSError as exc:
            said += f"{'; ' if said else ''}{python}: {exc.strerror}"
    raise AgentError(f"bench runner: run_as {user.name} can run no python ({said})",
                     kind=Kind.RUN_FAILED)  # fmt: skip


def _open_server_log(state: ServerState | None) -> int | None:
    if state is None:
        return None
    try:
        return os.open(state.log, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None


def _nvml_snapshot() -> list[JsonDict] | None:  # readings.GpuReading's
    """What nvml_before.json and nvml_after.json hold: each GPU's reading (None: no NVML)."""
    try:
        return [gpu.to_wire() for gpu in nvmlread.snapshot(nvmlread.load_pynvml())]
    except AgentError:
        return None


def bench_run(args: BenchRunArgs) -> RunStatusFile:
    from gpufleet.host.bench.runner import run_plan

    run_dir = _run_dir(args.run_id)
    ownership.take_over(run_dir / OWNER_SOCKET)  # a job step's runner: the host is the run's
    plan = BenchPlan.from_wire(json.loads((run_dir / "plan.json").read_text()), "plan.json")
    if (run_dir / HANDED_KEYS).exists():  # run as the run_as user: handed its inputs
        handed = run_dir / HANDED_STATE
        state = ServerState.from_wire(json.loads(handed.read_text())) if handed.exists() else None
        keys = serverkeys.read(str(run_dir / HANDED_KEYS))
    else:
        state = _state_of(plan)
        keys = serverkeys.read(state.key_file if state else None)
    facts = {"sysinfo.json": gpus.sysinfo(args).to_wire(), "nvml_before.json": _nvml_snapshot()}
    try:
        return run_plan(
            run_dir,
            state,
            facts,
            finish=lambda writer: writer.json("nvml_after.json", _nvml_snapshot()),
            keys=keys,
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


# The runner holds the host (ownership.held_fd) until its process ends, which is a moment
# after it writes its last status: a watch that answered "done" at once let the task's next
# verb (the cell's stop) find the host still held by the run, on a busy machine (CI, stop
# 74: "this host is in use by `inv sweep`" at a resume). A run is over when its runner is.
RUNNER_EXIT_S = 15.0


def _wait_runner_gone(run_dir: Path, within: float = RUNNER_EXIT_S) -> None:
    """Until the run's runner has exited (and so let go of the host), at most `within`."""
    deadline = time.monotonic() + within
    while _runner_alive(run_dir) and time.monotonic() < deadline:
        time.sleep(0.05)


def _read_run_file(run_dir: Path, name: str, offset: int = 0) -> bytes | None:
    """At most `bounded.RUN_LOOK` bytes from `offset` of a file the runner writes: in
    root's run directory, or where the runner ran as the run_as user, in that user's (read
    without following links: host/bench/userrun.py)."""
    if (run_dir / userrun.MARK).exists():
        return userrun.read(run_dir, name, offset, bounded.RUN_LOOK)
    try:
        with open(run_dir / name, "rb") as fh:
            fh.seek(offset)
            return bounded.take(fh, bounded.RUN_LOOK)
    except OSError:
        return None


def _emit_progress(run_dir: Path, offset: int) -> int:
    """Emit the complete progress lines written since `offset`; the new offset."""
    data = _read_run_file(run_dir, "progress.jsonl", offset)
    if data is None:
        return offset
    complete = data[: data.rfind(b"\n") + 1]
    if not complete and len(data) >= bounded.RUN_LOOK:  # a line over the bound: passed over
        return offset + len(data)
    for line in complete.decode(errors="replace").splitlines():
        try:
            emit_event(json.loads(line))
        except ValueError:
            continue
    return offset + len(complete)


def _read_status(run_dir: Path) -> RunStatusFile:
    """The run's status: root's own where it said the run ended, else the runner's."""
    try:
        own: RunStatusFile = json.loads((run_dir / "status.json").read_text())
        if own["status"] in (RunStatus.DONE, RunStatus.FAILED):
            return own
    except (OSError, ValueError, KeyError, TypeError):
        pass
    try:
        return json.loads(_read_run_file(run_dir, "status.json") or b"")
    except ValueError:
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
            userrun.take_back(run_dir)
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
    # said before the wait for the runner's exit: a job that ends in that wait takes the
    # answer, and the control side still knows the run finished (fetched, never re-run)
    emit_event({"phase": "finished", "status": status["status"]})
    _wait_runner_gone(run_dir)
    userrun.take_back(run_dir, remove=True)
    files = [  # the control plane fetches these, never through a link
        {"name": p.name, "size": p.stat().st_size}
        for p in sorted(run_dir.iterdir())
        if p.is_file() and not p.is_symlink() and not p.name.startswith(".")
    ]
    return {
        "status": status["status"],
        "reason": status.get("reason"),
        "files": files,
        "run_dir": str(run_dir.resolve()),
        "tail": status.get("tail"),
        "offset": offset,
    }
