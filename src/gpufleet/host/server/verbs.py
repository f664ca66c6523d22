"""Server lifecycle on the host: detached launch and wait-ready (stop, list and logs, the
verbs on a server already launched: host/server/running.py).

State lives in `<workdir>/servers/<port>.json` (host/server/state.py); `<port>.lock` makes
concurrent launches on one port exclusive. The server runs in its own session (setsid):
immune to the SSH session ending, and stoppable as one process group even after its
launcher died. Every signal first checks that the process group is still the server that
was launched (host/agent/procstat.py), so a stale state file never kills a stranger.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import subprocess
import time
from pathlib import Path

from gpufleet.host.agent import runas, safewrite
from gpufleet.host.agent.procstat import ProcRef
from gpufleet.host.agent.protocol import (
    AgentError,
    LaunchArgs,
    WaitReadyArgs,
    emit_event,
)
from gpufleet.host.agent.redact import (
    process_secrets,
    redact_argv,
    redact_env,
    remember,
    secret_values,
)
from gpufleet.host.proc import jobstep
from gpufleet.host.server import keys as serverkeys
from gpufleet.host.server import listener, logscan, placement
from gpufleet.host.server import probe as health
from gpufleet.host.server.preflight import as_user, launch_env, preflight, run_as_user
from gpufleet.host.server.running import stop_server
from gpufleet.host.server.state import (
    SERVERS,
    fresh_log,
    now_iso,
    read_state,
    server_alive,
    tail,
    write_state,
)
from gpufleet.kinds import Kind, ServerStatus
from gpufleet.readings import (
    LaunchAnswer,
    WaitReadyAnswer,
)
from gpufleet.records import LaunchSpec, ServerState


# -- launch ---------------------------------------------------------------------------
@contextlib.contextmanager
def port_lock(port: int):
    fd = safewrite.open_lock(SERVERS / f"{int(port)}.lock")
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise AgentError(
                f"another gpufleet launch on port {port} is in progress on this host",
                kind=Kind.LOCKED,
            ) from None
        yield
    finally:
        os.close(fd)


def _spawn(spec: LaunchSpec, step: jobstep.JobStep | None, user: runas.RunAs | None) -> int:
    """Start the server in its own session, stdout and stderr appended to its log; its PID.
    Inside a Slurm job the server is a step of that job (host/proc/jobstep.py), so it ends
    when the job ends."""
    log = Path(spec.log)
    with safewrite.open_append(log, buffering=0) as out:
        out.write(f"[gpufleet] {now_iso()} launching {spec.profile}\n".encode())
        if step is not None:
            env = jobstep.srun_env(launch_env(spec))
            try:
                return jobstep.spawn(
                    step, spec.argv, env, out, log=log, pid_file=SERVERS / f"{spec.port}.pid"
                )
            except jobstep.StepNotStarted as exc:
                raise AgentError(f"{exc}: {' | '.join(tail(str(log), 3))}",
                                 kind=Kind.CRASHED) from None  # fmt: skip
        try:
            return subprocess.Popen(  # type: ignore[call-overload]
                spec.argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=launch_env(spec, user),
                start_new_session=True,  # own session and process group: survives hangup
                close_fds=True,
                **as_user(user),  # run_as: the engine's code runs with that user's rights
            ).pid
        except OSError as exc:  # found by preflight, yet not runnable (by the run_as user)
            who = f" as {user.name} (run_as: it must be able to read and run it)" if user else ""
            raise AgentError(f"cannot start {spec.argv[0]}{who}: {exc.strerror}",
                             kind=Kind.PREFLIGHT) from None  # fmt: skip


def write_files(spec: LaunchSpec, user: runas.RunAs | None = None) -> LaunchSpec:
    """Write the profile's files into `<workdir>/files/` (content-hashed names: an equal
    file is written once), or as the run_as user into its own directory, and put their
    paths into argv in place of `{files}`."""
    files = spec.files or {}
    if not files:
        return spec
    for name in files:
        if "/" in name or name.startswith("."):
            raise AgentError(f"file name {name!r} is not a plain name", kind=Kind.USAGE)
    if user is not None:
        folder = Path(user.write_files(files))
    else:
        folder = Path.cwd() / safewrite.own_dir("files")
        for name, content in files.items():
            target = folder / name
            if not target.is_file() or target.is_symlink():
                safewrite.write_atomic(target, content)
    argv = [word.replace("{files}", str(folder)) for word in spec.argv]
    return dataclasses.replace(spec, argv=argv, files={})


KEYS_IN_ARGV = (
    "this engine takes its API key only on the command line (no --config): every local "
    "user can read it in `ps`; recorded in the run manifest"
)


def _keep_keys_out_of_argv(
    port: int, check: LaunchAnswer, user: runas.RunAs | None
) -> tuple[list[str], str | None, bool]:
    """argv with secret flags moved into `servers/<port>.keys.yaml` (read by the engine
    through `--config`; a run_as server reads its own copy, written as that user), the
    key file's path (root's copy, which the bench reads), and whether secrets stayed in
    argv."""
    argv = check.argv
    public, secrets = serverkeys.split(argv, 3)
    if not secrets:
        return argv, None, False
    path = str(serverkeys.write(port, secrets))
    if check.accepts_config and "--config" not in public:
        config = path
        if user is not None:
            name = serverkeys.key_file(port).name
            config = os.path.join(user.write_files({name: json.dumps(secrets)}), name)
        return [*public, "--config", config], path, False
    return argv, path, True


def launch(args: LaunchArgs) -> LaunchAnswer:
    if args.spec is None:
        raise AgentError("launch: missing argument 'spec'", kind=Kind.BAD_INPUT)
    remember(secret_values(args.spec.argv, args.spec.env))
    remember(args.spec.env[k] for k in args.spec.secret_env if k in args.spec.env)
    user, refused = run_as_user(args)
    spec = write_files(args.spec, None if refused else user)
    spec = placement.placed(spec)  # GPUs as NVML numbers them, before anything checks them
    args.spec = spec
    with port_lock(spec.port):
        check = preflight(args)
        if args.dry_run or check.errors:
            return dataclasses.replace(check, argv=redact_argv(check.argv))
        existing = read_state(spec.port)
        if existing and server_alive(existing) and args.replace:
            stop_server(existing, args.grace_s)
        argv, key_file, in_argv = _keep_keys_out_of_argv(spec.port, check, user)
        if in_argv:
            check.warnings.append(KEYS_IN_ARGV)
        # renames applied, keys in their file; a log of its own (a relaunch within the
        # stamp's second, or a template without {stamp}, never appends to another's)
        spec = dataclasses.replace(spec, argv=argv, log=fresh_log(spec.log))
        step = jobstep.JobStep.of(args.slurm_job, args.slurm_node)
        pid = _spawn(spec, step, user)
        ref = ProcRef.capture(pid) or ProcRef(pid, -1)  # -1: died at once
        state = ServerState(
            pid=pid,
            proc=ref.to_wire(),
            pgid=pid,  # its own session's (setsid), or the job step's task's
            argv=redact_argv(spec.argv),
            env=redact_env(spec.env, spec.secret_env),
            port=spec.port,
            health_url=f"http://{spec.health_host}:{spec.port}{spec.health_path}",
            profile=spec.profile,
            engine=spec.engine,
            engine_version=check.engine_version,
            slots=spec.slots,
            log=str(Path.cwd() / spec.log),
            gpus=spec.gpus,
            share_gpus=spec.share_gpus,
            resolved_profile=spec.resolved_profile,
            flag_renames=check.renames,
            key_file=key_file,
            secrets_in_argv=in_argv,
            node_rank=spec.node_rank,
            started_at=now_iso(),
            status=ServerStatus.STARTING,
            gpu_health=check.gpu_health,
            allowed_unhealthy=args.allow_unhealthy,
            slurm_job=args.slurm_job,
            user=runas.name_of(user),
        )
        write_state(state)
    return LaunchAnswer(
        started=True, state=state, warnings=check.warnings, renames=check.renames,
        engine_version=check.engine_version, gpu_health=check.gpu_health,
        dropped_env=check.dropped_env,
    )  # fmt: skip


# -- wait until healthy ---------------------------------------------------------------
def wait_ready(args: WaitReadyArgs) -> WaitReadyAnswer:
    """Poll until /health answers 200 (or, without health, the process runs); stream phases."""
    state = read_state(args.port)
    if state is None:
        raise AgentError(f"no server launched by gpufleet on port {args.port}", kind=Kind.NO_SERVER)
    remember(process_secrets(state.pid) if server_alive(state) else [])
    started = time.monotonic() - args.elapsed_before_s
    slice_end = time.monotonic() + args.slice_s if args.slice_s else None
    log = logscan.LogScanner(state.log, state.log_offset)
    phase = ""
    last_event = 0.0
    while True:
        elapsed = time.monotonic() - started
        fatal = log.fatal()
        if fatal:
            return _failed(state, "crashed", f"{fatal} in the server log")
        if not server_alive(state):
            return _failed(state, "crashed", "the server process exited")
        foreign = listener.refusal_for(state)  # before any probe: never ready on another's
        if foreign:
            return _failed(state, Kind.UNTRUSTED, foreign)
        new_phase = health.probe(state.health_url) if args.health else "running"
        if new_phase in ("ready", "running"):
            state.update(
                status=ServerStatus.READY if args.health else ServerStatus.RUNNING,
                ready_at=now_iso(),
            )
            write_state(state)
            emit_event(
                {"phase": new_phase, "elapsed_s": round(elapsed, 2), "last_line": log.last_line}
            )
            return WaitReadyAnswer(True, new_phase, round(elapsed, 3), state=state)
        if new_phase != phase or time.monotonic() - last_event >= 1.0:
            phase = new_phase
            last_event = time.monotonic()
            emit_event({"phase": phase, "elapsed_s": round(elapsed, 2), "last_line": log.last_line})
        if elapsed > args.timeout_s:
            return _failed(
                state, "timeout", f"not healthy after {args.timeout_s:g}s (last: {phase})"
            )
        if slice_end is not None and time.monotonic() >= slice_end:
            return WaitReadyAnswer(False, "waiting", round(elapsed, 3))
        time.sleep(args.poll_s)


def _failed(state: ServerState, status: str, reason: str) -> WaitReadyAnswer:
    state.update(status=ServerStatus.FAILED, failure=reason, failed_at=now_iso())
    write_state(state)
    return WaitReadyAnswer(False, status, reason=reason, tail=tail(state.log), state=state)
