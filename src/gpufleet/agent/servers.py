"""Server lifecycle on the host: preflight, detached launch, wait-ready, stop, list, logs.

State lives in `<workdir>/servers/<port>.json` (pid, process group, argv, port, profile, log,
start time, engine version, status); `<port>.lock` makes concurrent launches on one port
exclusive. The server runs in its own session (setsid): immune to the SSH session ending,
and stoppable as one process group even after its launcher died.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpufleet.agent import healthprobe, nvmlread
from gpufleet.agent.protocol import AgentError, emit_event

SERVERS = Path("servers")
FATAL_PATTERNS = [
    ("Traceback (most recent call last)", "Python traceback"),
    ("Initialization failed", "initialization failed"),
    ("CUDA out of memory", "CUDA out of memory"),
    ("OutOfMemoryError", "out of memory"),
    ("address already in use", "address already in use"),
    ("[Errno 98]", "address already in use"),
]
SECRET_NAME = re.compile(
    r"(TOKEN|SECRET|PASSWORD|PASSWD|API_?KEY|ACCESS_?KEY|CREDENTIAL|_KEY$)", re.I
)
ENGINE_MODULES = {
    "sglang": ("sglang", "sglang.launch_server"),
    "sim": (None, "gpufleet.sim.server"),
}


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _state_path(port: int) -> Path:
    return SERVERS / f"{int(port)}.json"


def _write_state(state: dict[str, Any]) -> None:
    SERVERS.mkdir(mode=0o700, exist_ok=True)
    tmp = SERVERS / f".{state['port']}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(state, indent=2))
    os.replace(tmp, _state_path(state["port"]))


def read_state(port: int) -> dict[str, Any] | None:
    try:
        return json.loads(_state_path(port).read_text())
    except (OSError, ValueError):
        return None


def _start_ticks(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return None if fields[0] in ("Z", "X") else fields[19]


def server_alive(state: dict[str, Any]) -> bool:
    return _start_ticks(state["pid"]) == state.get("pid_start")


def _redact(env: dict[str, str]) -> dict[str, str]:
    return {k: ("***" if SECRET_NAME.search(k) else v) for k, v in env.items()}


def _agent_pythonpath() -> list[str]:
    """Paths that make `gpufleet.sim.server` importable from this zipapp, for the sim engine."""
    root = str(Path(__file__).resolve().parent.parent.parent)
    return [root]


def engine_version(engine: str) -> str | None:
    if engine == "sglang":
        from importlib import metadata

        try:
            return metadata.version("sglang")
        except metadata.PackageNotFoundError:
            return None
    if engine == "sim":
        from gpufleet import __version__

        return f"gpufleet-sim {__version__}"
    return None


# -- preflight ------------------------------------------------------------------------
def _port_free(host: str, port: int) -> str | None:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        # Like uvicorn: connections in TIME_WAIT from the last server do not block the port.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            return f"port {port} on {host} is taken ({exc.strerror})"
    return None


def _help_flags(argv_head: list[str], env: dict[str, str]) -> tuple[set[str], str]:
    out = subprocess.run(
        [*argv_head, "--help"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        stdin=subprocess.DEVNULL,
    )
    text = out.stdout + out.stderr
    if out.returncode != 0:
        raise AgentError(
            f"`{' '.join(argv_head[1:])} --help` failed: {text.strip()[-300:]}", kind="preflight"
        )
    return set(re.findall(r"(?<![\w-])(--[A-Za-z0-9][A-Za-z0-9_-]*)", text)), text


def check_flags(argv: list[str], head: int, env: dict[str, str]) -> tuple[list[str], list[str]]:
    """Every `--flag` in argv must be one the engine's own --help lists on this host."""
    known, text = _help_flags(argv[:head], env)
    errors, warnings = [], []
    for word in argv[head:]:
        if not word.startswith("--"):
            continue
        flag = word.split("=", 1)[0]
        if flag in known:
            if re.search(re.escape(flag) + r"[^\n]*\n?[^\n]*deprecated", text, re.I):
                warnings.append(f"{flag} is deprecated in this engine version")
            continue
        prefixed = sorted(k for k in known if k.startswith(flag))
        if len(prefixed) == 1:
            warnings.append(f"{flag} is accepted only as a prefix of {prefixed[0]}")
        elif prefixed:
            errors.append(f"{flag} is ambiguous here (could be {', '.join(prefixed[:4])})")
        else:
            errors.append(f"{flag} is not accepted by this engine version")
    return errors, warnings


def _gpus_in_use(gpus: list[int]) -> list[str]:
    nvml = nvmlread.load_pynvml()
    snap = {g["index"]: g for g in nvmlread.snapshot(nvml)}
    problems = []
    for index in gpus:
        gpu = snap.get(index)
        if gpu is None:
            problems.append(f"GPU {index} does not exist (NVML sees {len(snap)})")
        elif gpu["used_mib"] > 0 or gpu["processes"]:
            pids = ",".join(str(p["pid"]) for p in gpu["processes"]) or "none listed"
            problems.append(f"GPU {index} is in use: {gpu['used_mib']} MiB (PIDs {pids})")
    return problems


def _launch_env(spec: dict[str, Any]) -> dict[str, str]:
    env = dict(os.environ)
    env.update(spec["env"])
    if spec["engine"] == "sim":
        parts = _agent_pythonpath()
        if os.environ.get("GPUFLEET_SIM_STATE"):
            parts.insert(0, nvmlread.shim_dir())
        env["PYTHONPATH"] = os.pathsep.join([*parts, env.get("PYTHONPATH", "")]).rstrip(":")
    return env


def preflight(args: dict[str, Any]) -> dict[str, Any]:
    spec = args["spec"]
    errors: list[str] = list(args.get("extra_errors", []))
    warnings: list[str] = list(spec.get("warnings", []))
    existing = read_state(spec["port"])
    if existing and server_alive(existing):
        if not args.get("replace"):
            errors.append(
                f"a server ({existing['profile']}, pid {existing['pid']}) already runs on port "
                f"{spec['port']}; stop it or use --replace"
            )
    else:
        problem = _port_free(spec["host"], spec["port"])
        if problem:
            errors.append(problem)
    if spec["check_model_path"] and not Path(spec["model_path"]).exists():
        errors.append(f"model path {spec['model_path']!r} does not exist on this host")
    engine = spec["engine"]
    version = engine_version(engine)
    if engine == "sglang" and version is None:
        errors.append(f"{sys.executable} has no sglang installed (pip show sglang found nothing)")
    if not args.get("skip_gpu_check") and not (existing and args.get("replace")):
        try:
            errors += _gpus_in_use(spec["gpus"])
        except AgentError as exc:
            if spec["engine"] != "custom":
                errors.append(str(exc))
    if engine in ENGINE_MODULES and not errors and not args.get("skip_flag_check"):
        flag_errors, flag_warnings = check_flags(spec["argv"], 3, _launch_env(spec))
        errors += [f"flag {e}" for e in flag_errors]
        warnings += flag_warnings
    return {"ok": not errors, "errors": errors, "warnings": warnings, "engine_version": version}


# -- launch ---------------------------------------------------------------------------
@contextlib.contextmanager
def port_lock(port: int):
    SERVERS.mkdir(mode=0o700, exist_ok=True)
    fd = os.open(SERVERS / f"{int(port)}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise AgentError(
                f"another gpufleet launch on port {port} is in progress on this host",
                kind="locked",
            ) from None
        yield
    finally:
        os.close(fd)


def launch(args: dict[str, Any]) -> dict[str, Any]:
    spec = args["spec"]
    with port_lock(spec["port"]):
        check = preflight(args)
        if not check["ok"]:
            return {"started": False, **check}
        existing = read_state(spec["port"])
        if existing and server_alive(existing) and args.get("replace"):
            stop_server(existing, float(args.get("grace_s", 15)))
        log = Path(spec["log"])
        log.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with open(log, "ab", buffering=0) as out:
            out.write(f"[gpufleet] {_now()} launching {spec['profile']}\n".encode())
            proc = subprocess.Popen(
                spec["argv"],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=_launch_env(spec),
                start_new_session=True,  # own session and process group: survives hangup
                close_fds=True,
            )
        time.sleep(0.05)
        state = {
            "pid": proc.pid,
            "pid_start": _start_ticks(proc.pid),
            "pgid": proc.pid,
            "argv": spec["argv"],
            "env": _redact(spec["env"]),
            "port": spec["port"],
            "health_url": f"http://{spec['health_host']}:{spec['port']}{spec['health_path']}",
            "profile": spec["profile"],
            "engine": spec["engine"],
            "engine_version": check["engine_version"],
            "log": str(Path.cwd() / log),
            "log_offset": 0,
            "gpus": spec["gpus"],
            "node_rank": spec.get("node_rank", 0),
            "started_at": _now(),
            "status": "starting",
        }
        _write_state(state)
    return {"started": True, "state": state, "warnings": check["warnings"]}


# -- wait until healthy ---------------------------------------------------------------


def tail(path: str, lines: int = 40) -> list[str]:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 256 * 1024))
            data = fh.read().decode(errors="replace")
    except OSError:
        return []
    return data.splitlines()[-lines:]


def wait_ready(args: dict[str, Any]) -> dict[str, Any]:
    state = read_state(args["port"])
    if state is None:
        raise AgentError(f"no server launched by gpufleet on port {args['port']}", kind="no_server")
    timeout = float(args.get("timeout_s", 1800))
    poll = float(args.get("poll_s", 0.2))
    check_health = args.get("health", True)
    started = time.monotonic()
    offset = state.get("log_offset", 0)
    last_line = ""
    phase = ""
    last_event = 0.0
    while True:
        elapsed = time.monotonic() - started
        try:
            with open(state["log"], "rb") as fh:
                fh.seek(offset)
                chunk = fh.read()
        except OSError:
            chunk = b""
        if chunk:
            offset += len(chunk)
            text = chunk.decode(errors="replace")
            lines = [ln for ln in text.splitlines() if ln.strip()]
            if lines:
                last_line = lines[-1][-200:]
            for needle, label in FATAL_PATTERNS:
                if needle in text:
                    return _failed(state, "crashed", f"{label} in the server log")
        if not server_alive(state):
            return _failed(state, "crashed", "the server process exited")
        new_phase = healthprobe.probe(state["health_url"]) if check_health else "running"
        if new_phase in ("ready", "running"):
            state.update(status="ready" if check_health else "running", ready_at=_now())
            _write_state(state)
            emit_event({"phase": new_phase, "elapsed_s": round(elapsed, 2), "last_line": last_line})
            return {
                "ready": True,
                "phase": new_phase,
                "elapsed_s": round(elapsed, 3),
                "state": state,
            }
        if new_phase != phase or time.monotonic() - last_event >= 1.0:
            phase = new_phase
            last_event = time.monotonic()
            emit_event({"phase": phase, "elapsed_s": round(elapsed, 2), "last_line": last_line})
        if elapsed > timeout:
            return _failed(state, "timeout", f"not healthy after {timeout:g}s (last: {phase})")
        time.sleep(poll)


def _failed(state: dict[str, Any], status: str, reason: str) -> dict[str, Any]:
    state.update(status="failed", failure=reason, failed_at=_now())
    _write_state(state)
    return {
        "ready": False,
        "phase": status,
        "reason": reason,
        "tail": tail(state["log"]),
        "state": state,
    }


# -- stop, list, logs -----------------------------------------------------------------
def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # Zombies still count for killpg(0); look for a live member.
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            raw = stat.read_text()
        except OSError:
            continue
        fields = raw[raw.rindex(")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            return True
    return False


def stop_server(state: dict[str, Any], grace_s: float) -> str:
    pgid = state["pgid"]
    signal_used = "none (already gone)"
    if _group_alive(pgid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
        signal_used = "SIGTERM"
        deadline = time.monotonic() + grace_s
        while _group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _group_alive(pgid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
            signal_used = "SIGKILL"
            deadline = time.monotonic() + 5
            while _group_alive(pgid) and time.monotonic() < deadline:
                time.sleep(0.05)
    state.update(status="stopped", stopped_at=_now(), stop_signal=signal_used)
    _write_state(state)
    return signal_used


def stop(args: dict[str, Any]) -> dict[str, Any]:
    from gpufleet.agent import verbs

    states = [s for s in all_states() if args.get("profile") in (None, s["profile"])]
    if args.get("port") is not None:
        states = [s for s in states if s["port"] == int(args["port"])]
    stopped = []
    gpus: set[int] = set()
    for state in states:
        if state.get("status") == "stopped":
            continue
        how = stop_server(state, float(args.get("grace_s", 15)))
        stopped.append(
            {"port": state["port"], "profile": state["profile"], "pid": state["pid"], "signal": how}
        )
        gpus.update(state.get("gpus", []))
    verify = None
    if gpus and args.get("verify", True):
        verify = verbs.wait_gpus_clean(sorted(gpus), float(args.get("timeout_s", 60)))
    return {"stopped": stopped, "verify": verify}


def all_states() -> list[dict[str, Any]]:
    out = []
    for path in sorted(SERVERS.glob("*.json")):
        try:
            out.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return out


def servers(args: dict[str, Any]) -> dict[str, Any]:
    out = []
    for state in all_states():
        alive = server_alive(state)
        if state.get("status") == "stopped" and not alive:
            continue
        entry = {
            k: state.get(k)
            for k in (
                "profile",
                "pid",
                "port",
                "status",
                "started_at",
                "engine",
                "engine_version",
                "log",
            )
        }
        entry["alive"] = alive
        entry["health"] = healthprobe.probe(state["health_url"]) if alive else "down"
        if alive:
            started = datetime.fromisoformat(state["started_at"].replace("Z", "+00:00"))
            entry["uptime_s"] = round((datetime.now(UTC) - started).total_seconds(), 1)
        out.append(entry)
    return {"servers": out}


def logs(args: dict[str, Any]) -> dict[str, Any]:
    states = all_states()
    if args.get("port") is not None:
        states = [s for s in states if s["port"] == int(args["port"])]
    if args.get("profile"):
        states = [s for s in states if s["profile"] == args["profile"]]
    if not states:
        raise AgentError("no server launched by gpufleet matches", kind="no_server")
    state = max(states, key=lambda s: s["started_at"])
    lines = tail(state["log"], int(args.get("lines", 40)))
    if not args.get("follow"):
        return {"log": state["log"], "lines": lines}
    for line in lines:
        emit_event({"line": line})
    with open(state["log"], "rb") as fh:
        fh.seek(0, os.SEEK_END)
        deadline = time.monotonic() + float(args.get("follow_s", 86400))
        while time.monotonic() < deadline:
            data = fh.readline()
            if data:
                emit_event({"line": data.decode(errors="replace").rstrip("\n")})
            else:
                time.sleep(0.2)
    return {"log": state["log"], "lines": []}
