"""Launch preflight on the host: what can refuse a launch in seconds, not after a model load.

The GPUs the server will use read 0 MiB, the port is free (or held by our own server with
--replace), the model path exists, the engine is installed, and every flag is one the
engine's own `--help` lists on this host.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from gpufleet.host.agent import bounded, childenv, runas, safewrite, simulation
from gpufleet.host.agent.protocol import AgentError, LaunchArgs
from gpufleet.host.gpu import health as gpuhealth
from gpufleet.host.gpu import nvml as nvmlread
from gpufleet.host.server import flagrenames, live, models
from gpufleet.host.server.state import read_state, server_alive
from gpufleet.kinds import Kind
from gpufleet.readings import GpuReading, LaunchAnswer
from gpufleet.records import LaunchSpec, RenameSpec


def as_user(user: runas.RunAs | None) -> runas.PopenAs | dict[str, str]:
    """subprocess's arguments that start a child as the run_as user (none: as root)."""
    return {} if user is None else user.popen()


DENIED = "permission denied"


def version_refusal(spec: LaunchSpec, user: runas.RunAs | None, said: str) -> str | None:
    """Why the engine's version cannot be read, where its probe printed nothing: the
    adapter's "not installed", unless the probe (`said`: its last words) could not read
    or run what it needs (a run_as user)."""
    if not spec.version_missing:
        return None
    if DENIED in said.lower():
        who = f" as {user.name}" if user else ""
        return (f"{spec.version_argv[0]}{who}: {said} (run_as: that user must be able to "
                "read the engine's Python and its packages)")  # fmt: skip
    return f"{spec.version_argv[0]} {spec.version_missing}"


def program_version(
    argv: list[str], env: dict[str, str], user: runas.RunAs | None = None
) -> tuple[str | None, str]:
    """An engine's version as its probe prints it (`llama-server --version` on stderr:
    `version: 7134 (0a1b2c3)`; SGLang's distribution version on stdout): its first line
    naming a version, else its first line; and, where it failed, its last words."""
    if not argv:
        return None, ""
    try:
        out = bounded.run(argv, bounded.PROGRAM_OUTPUT, 60, env=env,
                          stdin=subprocess.DEVNULL, **as_user(user))  # fmt: skip
    except bounded.TooLarge as exc:
        return None, str(exc)
    except OSError as exc:
        return None, f"cannot run it: {exc.strerror}"
    except subprocess.TimeoutExpired:
        return None, "timed out after 60 s"
    if out.returncode != 0:
        return None, (out.stderr.strip().splitlines() or [""])[-1].strip()[:300]
    # stdout where it says anything (a warning on stderr may name a version too), else
    # stderr (llama-server prints its version there)
    lines = [x.strip() for x in out.stdout.splitlines() if x.strip()] or [
        x.strip() for x in out.stderr.splitlines() if x.strip()
    ]
    if not lines:
        return None, ""
    line = next((x for x in lines if "version" in x.lower()), lines[0])
    return line.removeprefix("version:").strip()[:80] or None, ""


def launch_env(spec: LaunchSpec, user: runas.RunAs | None = None) -> dict[str, str]:
    """The server's environment: the login's allow-listed part (host/agent/childenv.py), the
    profile's own variables, on a simulated host the rehearsal engine's paths, and the
    run_as user's HOME and names."""
    env = childenv.child_env(spec.env)
    if user is not None:
        env = user.env(env)
    parts = []
    rehearsal = simulation.installed()
    if rehearsal and os.environ.get("GPUFLEET_SIM_STATE"):
        parts = [rehearsal.shim_dir(), rehearsal.import_root()]
    elif spec.engine == "sim":  # gpufleet.sim.server importable from this zipapp
        parts = [simulation.provider().import_root()]
    if parts:
        env["PYTHONPATH"] = os.pathsep.join([*parts, env.get("PYTHONPATH", "")]).rstrip(":")
    return env


def _port_free(host: str, port: int) -> str | None:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        # Like uvicorn: connections in TIME_WAIT from the last server do not block the port.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            return f"port {port} on {host} is taken ({exc.strerror})"
    return None


HELP_CACHE = Path("cache") / "engine-help"  # in the workdir: one file per engine version


def help_text(
    argv_head: list[str],
    env: dict[str, str],
    version: str | None = None,
    user: runas.RunAs | None = None,
) -> str:
    """The engine's own `--help` on this host, kept per installed version in the workdir:
    SGLang's takes ~16 s on a CPU, and every cell of a sweep launches again. The key is the
    version, the command, the server's PYTHONPATH and this agent (a new gpufleet asks
    again); an unknown version is never kept."""
    if version is None:
        return _run_help(argv_head, env, user)
    key = json.dumps([version, argv_head, env.get("PYTHONPATH", ""), Path(sys.argv[0]).name])
    path = HELP_CACHE / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.txt"
    kept = safewrite.read_own(path)
    if kept is not None:
        return kept.decode(errors="replace")
    text = _run_help(argv_head, env, user)
    safewrite.write_atomic(path, text)
    return text


def _run_help(argv_head: list[str], env: dict[str, str], user: runas.RunAs | None) -> str:
    try:
        out = bounded.run([*argv_head, "--help"], bounded.PROGRAM_OUTPUT, 300, env=env,
                          stdin=subprocess.DEVNULL, **as_user(user))  # fmt: skip
    except bounded.TooLarge as exc:
        said = f"`{' '.join(argv_head[1:])} --help`: {exc}"
        raise AgentError(said, kind=Kind.PREFLIGHT) from None
    text = out.stdout + out.stderr
    if out.returncode != 0:
        raise AgentError(
            f"`{' '.join(argv_head[1:])} --help` failed: {text.strip()[-300:]}", kind=Kind.PREFLIGHT
        )
    return text


@dataclass
class FlagCheck:
    argv: list[str]  # with known renames applied
    renames: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def check_flags_against(
    argv: list[str], head: int, help_text: str, engine: str, renames: list[RenameSpec] | None = None
) -> FlagCheck:
    """Every `--flag` in argv must be one this --help lists, after the engine's renames."""
    known = set(re.findall(r"(?<![\w-])(--[A-Za-z0-9][A-Za-z0-9_-]*)", help_text))
    renamed, notes = flagrenames.apply(
        argv, head, known, help_text, engine=engine, renames=renames or []
    )
    check = FlagCheck(argv=renamed, renames=notes)
    errors, warnings = check.errors, check.warnings
    for word in renamed[head:]:
        if not word.startswith("--"):
            continue
        flag = word.split("=", 1)[0]
        if flag in known:
            if flagrenames.deprecated(flag, help_text):
                warnings.append(f"{flag} is deprecated in this engine version")
            continue
        prefixed = sorted(k for k in known if k.startswith(flag))
        if len(prefixed) == 1:
            warnings.append(f"{flag} is accepted only as a prefix of {prefixed[0]}")
        elif prefixed:
            errors.append(f"{flag} is ambiguous here (could be {', '.join(prefixed[:4])})")
        else:
            errors.append(f"{flag} is not accepted by this engine version")
    return check


@dataclass
class GpuCheck:
    """What the launch's GPUs say: refusals, warnings, and each GPU's health verdict (kept
    in the server's state and the runs' manifests)."""

    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    health: list[str] = field(default_factory=list)


def busy(gpu: GpuReading, shares: bool, neighbours: list[live.LiveServer]) -> str | None:
    """Why a GPU that does not read 0 MiB refuses the launch, or None where every process
    on it belongs to a running gpufleet server launched to share, and this one shares too."""
    pids = {p.pid for p in gpu.processes}
    holders = [n for n in neighbours if n.pids & pids]
    held = {pid for n in holders for pid in n.pids}
    if shares and pids and pids <= held and all(n.shares for n in holders):
        return None
    listed = ",".join(str(p) for p in sorted(pids)) or "none listed"
    line = f"GPU {gpu.index} is in use: {gpu.used_mib} MiB (PIDs {listed})"
    if holders:
        line += ", by gpufleet's " + ", ".join(f"server :{n.port} ({n.profile})" for n in holders)
        if pids <= held:
            line += "; to run beside it, set `share_gpus: true` in both profiles"
    return line


def check_gpus(gpus: list[int], args: LaunchArgs, in_use: bool) -> GpuCheck:
    """The launch's GPUs exist, are free (unless `in_use` is skipped, or every holder is a
    gpufleet server this one may share with) and are healthy: a `bad` GPU refuses the
    launch unless --allow-unhealthy, a `warn` is said."""
    nvml = nvmlread.load_pynvml()
    readings = nvmlread.snapshot(nvml)
    gpuhealth.attach(nvml, readings, remember_xids=False)
    snap = {g.index: g for g in readings}
    out = GpuCheck()
    hint = args.status_hint or f"inv status --hosts {args.host}"
    spec = args.spec
    neighbours: list[live.LiveServer] | None = None
    for index in gpus:
        gpu = snap.get(index)
        if gpu is None:
            out.errors.append(f"GPU {index} does not exist (NVML sees {len(snap)})")
            continue
        if in_use and not gpu.is_clean():
            if neighbours is None:
                neighbours = live.running(frozenset({spec.port} if spec else ()))
            problem = busy(gpu, bool(spec and spec.share_gpus), neighbours)
            if problem:
                out.errors.append(problem)
        health = gpu.health
        if health is None or health.verdict == "ok":
            out.health.append(f"GPU {index}: ok")
            continue
        words = "; ".join(r.split(": ", 1)[1] for r in health.reasons)
        out.health.append(f"GPU {index}: {health.verdict}: {words}")
        if health.verdict == "bad" and not args.allow_unhealthy:
            out.errors.append(
                f"GPU {index} is unhealthy: {words} (see `{hint}`; --allow-unhealthy launches "
                "anyway and records it)"
            )
        else:
            anyway = " (launched anyway: --allow-unhealthy)" if health.verdict == "bad" else ""
            out.warnings.append(f"GPU {index} {health.verdict}: {words}{anyway}")
    return out


def _missing_program(spec: LaunchSpec) -> str | None:
    """An engine's program (or a module engine's Python) that is not on this host (as the
    server's PATH finds it): one line at preflight, and so at --dry-run, instead of a
    traceback at launch."""
    if not spec.argv:
        return None
    program = spec.argv[0]
    path = launch_env(spec).get("PATH", os.defpath)
    if os.sep in program:
        found = os.path.isfile(program) and os.access(program, os.X_OK)
    else:
        found = shutil.which(program, path=path) is not None
    if found:
        return None
    where = "is not an executable file" if os.sep in program else f"is not on PATH ({path})"
    return f"the engine's program {program!r} {where} on this host"


def run_as_user(args: LaunchArgs) -> tuple[runas.RunAs | None, list[str]]:
    """The user this launch's server and probes run as, and why it cannot (one line)."""
    user = runas.resolve(args.run_as)
    if user is None:
        return None, []
    why = runas.cannot_run_as(args.spec.engine if args.spec else None, bool(args.slurm_job))
    return user, [f"run_as {user.name}: {why}"] if why else []


def preflight(args: LaunchArgs) -> LaunchAnswer:
    """Everything that can refuse a launch in seconds rather than after a model load."""
    spec = args.spec
    assert spec is not None, "launch checks its spec before preflight"
    user, errors = run_as_user(args)
    errors += childenv.refusals(spec.env)
    unsafe, dropped = childenv.dropped_names()
    warnings: list[str] = [*spec.warnings, *childenv.unsafe_notes(unsafe)]
    existing = read_state(spec.port)
    if existing and server_alive(existing):
        if not args.replace:
            errors.append(
                f"a server ({existing.profile}, pid {existing.pid}) already runs on port "
                f"{spec.port}; stop it or use --replace"
            )
    else:
        problem = _port_free(spec.host, spec.port)
        if problem:
            errors.append(problem)
    if spec.check_model_path and not Path(spec.model_path).exists():
        errors.append(f"model path {spec.model_path!r} does not exist on this host")
    refused, said = models.refusals_and_warnings(spec, as_root=user is None)
    errors += refused
    warnings += said
    engine = spec.engine
    missing = _missing_program(spec)
    if missing:
        errors.append(missing)
    version = spec.version
    if not errors and version is None:
        version, said = program_version(spec.version_argv, launch_env(spec, user), user)
        refusal = version_refusal(spec, user, said) if version is None else None
        if refusal:
            errors.append(refusal)
    health: list[str] = []
    if not args.skip_gpu_check and spec.needs_gpu:  # a CPU engine's host may have none
        try:
            gpus = check_gpus(spec.gpus, args, in_use=not (existing and args.replace))
            errors += gpus.errors
            warnings += gpus.warnings
            health = gpus.health
        except AgentError as exc:
            if spec.engine != "custom":
                errors.append(str(exc))
    argv, renames, accepts_config = spec.argv, [], False
    if spec.help_argv and not errors and not args.skip_flag_check:
        text = help_text(spec.help_argv, launch_env(spec, user), version, user)
        check = check_flags_against(
            spec.argv, spec.flags_from, text, f"{engine} {version or ''}".strip(), spec.renames
        )
        argv, renames = check.argv, check.renames
        accepts_config = spec.takes_config and ("--config CONFIG" in text or "--config " in text)
        errors += [f"flag {e}" for e in check.errors]
        warnings += check.warnings
    return LaunchAnswer(
        started=False, errors=errors, warnings=warnings, renames=renames, argv=argv,
        engine_version=version, accepts_config=accepts_config, gpu_health=health,
        dropped_env=dropped,
    )  # fmt: skip
