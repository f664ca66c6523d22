"""Issue 80, bullet 2: every read of what a server, its log, its user or a host gives is
bounded, with the bound stated (host/agent/bounded.py, control/bench/intake.py). Each
reader is fed an endless or huge input (an endless HTTP body, a log extended by a 1 GiB
hole, a program that prints without end, a sparse 768 MiB file in a run's directory) and
the peak memory of the process that reads is checked: tens of MiB, not GiB. The census at
the end fails on a read in host/ that goes around the bounded helpers without a reason."""

from __future__ import annotations

import ast
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from helpers import REPO
from test_reliability import record

MIB = 1 << 20
HOLE = 1 << 30  # the log hole
GROWTH = 32 * MIB  # what a reader may add to its process's peak, whatever it is fed

# A reader runs in a child of its own, its address space capped (so the unbounded reader
# of an older gpufleet fails fast instead of taking the machine), and prints its peak.
CHILD = textwrap.dedent(
    """
    import json, resource, sys
    from pathlib import Path
    resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
    def hwm():
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    from gpufleet.host.agent import bounded
    from gpufleet.host.bench import bench_verbs, loadgen, rundir, serverapi
    from gpufleet.host.server import logscan, preflight, probe, state
    from gpufleet.host.proc import procfs
    from gpufleet.records import ServerState
    ARG = sys.argv[1]
    SERVER = ServerState(pid=1, port=1, profile="p", engine="sim", health_url="", log=ARG,
                         started_at="")
    base = hwm()
    try:
        exec("result = " + sys.argv[2])
        said = repr(result)
    except Exception as exc:
        said = f"raised {exc!r}"
    print(json.dumps({"base": base, "peak": hwm(), "said": said[-300:]}))
    """
)


def _peak(call: str, arg: str) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, arg, call], capture_output=True,
                         text=True, timeout=120, cwd=REPO)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.splitlines()[-1])


@contextlib.contextmanager
def _serving(answer: Callable[[socket.socket], None]) -> Iterator[str]:
    """A loopback server that hands each connection to `answer` on a thread of its own:
    its URL, until the block ends."""
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:  # closed: the block ended
                return
            threading.Thread(target=answer, args=(conn,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"
    finally:
        server.close()


@pytest.fixture
def endless_url() -> Iterator[str]:
    """An HTTP server whose every answer is a 200 with a body that never ends (until 3 GiB,
    so an unbounded reader of an older gpufleet ends too)."""
    stop = threading.Event()

    def answer(conn: socket.socket) -> None:
        with conn:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         b"Connection: close\r\n\r\n[")  # fmt: skip
            chunk = b"0," * 32768
            with_sent = 0
            while not stop.is_set() and with_sent < 3 << 30:
                try:
                    conn.sendall(chunk)
                except OSError:
                    return
                with_sent += len(chunk)

    with _serving(answer) as url:
        yield url
        stop.set()


HTTP_READERS = {
    "/server_info (serverapi._get_json)": "serverapi.server_info(ARG, {})",
    "/metrics (serverapi._get_page)": "serverapi._get_page(ARG + '/metrics', {}, 5.0)",
    "/health (probe.get)": "len(probe.get(ARG + '/health', 5.0)[1])",
}


@pytest.mark.parametrize("reader", sorted(HTTP_READERS))
def test_an_endless_http_body_is_read_to_its_bound(endless_url, reader):
    got = _peak(HTTP_READERS[reader], endless_url)
    grew = got["peak"] - got["base"]
    assert grew < GROWTH, f"{reader}: peak grew {grew / MIB:.0f} MiB ({got['said']})"
    record(f"bounded_http {reader}", {"peak_growth_mib": round(grew / MIB, 1)})


def _holed(path: Path) -> Path:
    """A file that gained a 1 GiB hole, then a fatal line, since the last look."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:
        fh.write(b"loading the model\n")
        os.ftruncate(fh.fileno(), HOLE)
    with open(path, "ab") as fh:
        fh.write(b"Traceback (most recent call last)\n")
    return path


@pytest.fixture
def streaming_url() -> Iterator[str]:
    """A server whose streamed answers count far more tokens than asked: /generate/huge
    claims 10^9 in its second chunk, /generate/endless 1,000 more in each of 64 MiB of
    chunks (then ends the stream as SGLang does)."""
    head = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
        b'data: {"text": "x", "meta_info": {"completion_tokens": 1, "prompt_tokens": 1}}\n\n'
    )

    def event(tokens: int) -> bytes:
        return b'data: {"text": "x", "meta_info": {"completion_tokens": %d}}\n\n' % tokens

    def answer(conn: socket.socket) -> None:
        with conn:
            huge = b"/huge" in conn.recv(65536)
            try:
                conn.sendall(head)
                if huge:
                    conn.sendall(event(10**9))
                else:
                    for start in range(1, 64 * MIB // 50, 4096):
                        conn.sendall(b"".join(event(1000 * n) for n in range(start, start + 4096)))
                conn.sendall(b"data: [DONE]\n\n")
            except OSError:
                return

    with _serving(answer) as url:
        yield url


ANSWER = (
    "[r.error for r in loadgen.run_async(loadgen.run_level(ARG, "
    "[loadgen.Prompt('hi', output_len=8)], 1, loadgen.LevelSpec(warmup=0))).records]"
)


@pytest.mark.parametrize("route", ["huge", "endless"])
def test_a_streamed_answer_that_counts_without_end_is_stopped_at_its_bound(streaming_url, route):
    """The load generator keeps a gap per token: an answer's count is bounded by the tokens
    asked for (twice, and 1,024 more), or a claim of 10^9 would be 8 GB of gaps."""
    got = _peak(ANSWER, f"{streaming_url}/{route}")
    grew = got["peak"] - got["base"]
    record(f"bounded_answer {route}", {"peak_growth_mib": round(grew / MIB, 1)})
    assert grew < GROWTH, f"{route}: peak grew {grew / MIB:.0f} MiB ({got['said']})"
    assert "the answer went past 1040 tokens" in got["said"], got["said"]


@pytest.fixture
def holed_log(tmp_path) -> Path:
    """A server's log with its 1 GiB hole, a run directory whose progress.jsonl has one
    too, and an empty run directory to write into (`out/`)."""
    _holed(tmp_path / "run" / "progress.jsonl")
    (tmp_path / "out").mkdir()
    return _holed(tmp_path / "logs" / "server.log")


LOG_READERS = {
    "wait-ready's scan (logscan.LogScanner)": "logscan.LogScanner(ARG, 0).fatal()",
    "logs --follow (logscan.follow)": "[len(x) for x in logscan.follow(open(ARG, 'rb'), 0)[0]]",
    "crash tails (state.tail)": "[len(x) for x in state.tail(ARG)]",
    "the run's copy of the log (rundir.write_server_log)": (
        "rundir.write_server_log(rundir.RunWriter(Path(ARG).parents[1] / 'out'), SERVER, "
        "[(0, 'go')])"
    ),
    "depth switches (rundir.depth_switches)": f"rundir.depth_switches(SERVER, 0, {HOLE + 64})",
    "bench-watch's progress (bench_verbs._emit_progress)": (
        "bench_verbs._emit_progress(Path(ARG).parents[1] / 'run', 0)"
    ),
}


# the run's copy of the server log keeps its newest 20 MiB (rundir.write_server_log), held
# as bytes, marked, decoded and scrubbed: four copies of its bound
COPY_GROWTH = 4 * 20 * MIB + 8 * MIB


@pytest.mark.parametrize("reader", sorted(LOG_READERS))
def test_a_log_extended_by_a_1_gib_hole_is_read_to_its_bound(holed_log, reader):
    got = _peak(LOG_READERS[reader], str(holed_log))
    grew = got["peak"] - got["base"]
    assert grew < (COPY_GROWTH if "copy" in reader else GROWTH), (
        f"{reader}: peak grew {grew / MIB:.0f} MiB ({got['said']})"
    )
    record(f"bounded_log {reader}", {"peak_growth_mib": round(grew / MIB, 1)})


def test_what_the_bounded_log_readers_say():
    """The newest part is what is read: the scan still finds the fatal line at the end, the
    follower says how much it skipped, and a tail's line is cut, said so."""
    from gpufleet.host.agent import bounded
    from gpufleet.host.server import logscan, state

    with tempfile.TemporaryDirectory() as folder:
        log = Path(folder) / "server.log"
        with open(log, "wb") as fh:
            fh.write(b"loading\n")
            os.ftruncate(fh.fileno(), 64 * MIB)
        with open(log, "ab") as fh:
            fh.write(b"\nTraceback (most recent call last)\n")
        assert logscan.LogScanner(str(log), 0).fatal() == "Python traceback"
        with open(log, "rb") as fh:
            lines, offset = logscan.follow(fh, 0)
        assert lines[0] == logscan.skipped_line(64 * MIB + 35 - bounded.LOG_LOOK)
        assert lines[-1] == "Traceback (most recent call last)" and offset == 64 * MIB + 35
        [*_, cut, last] = state.tail(str(log))
        assert last == "Traceback (most recent call last)"
        assert cut.endswith(" more characters cut]") and len(cut) < 2 * bounded.LOG_LINE


def test_a_probe_that_prints_without_end_is_stopped_at_its_bound():
    """An engine's --version and --help run as the run_as user: what they print is theirs."""
    got = _peak("preflight.program_version(['yes'], {'PATH': '/usr/bin:/bin'})", "")
    grew = got["peak"] - got["base"]
    assert grew < GROWTH, f"program_version: peak grew {grew / MIB:.0f} MiB ({got['said']})"
    assert "`yes` printed more than 4 MiB: stopped, not read" in got["said"]
    record("bounded_probe_output", {"peak_growth_mib": round(grew / MIB, 1)})


def test_a_probe_that_closes_its_streams_and_runs_on_ends_at_its_timeout():
    from gpufleet.host.agent import bounded

    started = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        bounded.run(
            ["sh", "-c", "exec >&- 2>&-; sleep 30"], MIB, 1.0, env={"PATH": "/usr/bin:/bin"}
        )
    assert time.monotonic() - started < 10  # killed, not waited for


def test_a_long_command_line_is_read_to_its_bound():
    from gpufleet.host.agent import bounded
    from gpufleet.host.proc import procfs

    words = ["x" * (120 << 10)] * 12  # 1.4 MiB of argv
    proc = subprocess.Popen(["sh", "-c", "sleep 30", *words])
    try:
        time.sleep(0.2)
        assert len("\0".join(procfs.Process(proc.pid).cmdline())) <= bounded.PROC_FILE
    finally:
        proc.kill()
        proc.wait()


# -- the control plane's fetch ---------------------------------------------------------------
# The CLI's own peak, read by itself as it exits: a child's ru_maxrss also counts what the
# forked pytest held before exec (a test holding 100 MiB of data read a CLI of 159 MiB).
OWN_PEAK = textwrap.dedent(
    """
    import atexit, runpy, sys
    where = sys.argv.pop(1)
    def said():
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                open(where, "w").write(line.split()[1])
    atexit.register(said)
    sys.argv[0] = "gpufleet"
    runpy.run_module("gpufleet", run_name="__main__", alter_sys=True)
    """
)


def _cli_peak(fleet, *args: str) -> tuple[int, str, int]:
    """Run the CLI; (exit status, what it said, its own peak RSS in bytes)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryDirectory() as folder:
        peak = Path(folder) / "peak"
        proc = subprocess.run([sys.executable, "-c", OWN_PEAK, str(peak), *args, "--inventory",
                               str(fleet.inventory)], stdout=out, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL, cwd=REPO, timeout=600)  # fmt: skip
        out.seek(0)
        said = out.read().decode(errors="replace")
        assert peak.exists(), said
        return proc.returncode, said, int(peak.read_text()) * 1024


@pytest.mark.slow(minutes=1)
def test_a_sparse_768_mib_file_in_a_run_stays_on_the_host(fleet, tmp_path):
    profile = fleet.profile("sparse", tp=1, sim={"load-seconds": 0.3, "warmup-seconds": 0.1})
    out = fleet.cli("launch", "--profile", str(profile), "--hosts", "h0")
    assert out.returncode == 0, out.stdout + out.stderr
    runs = fleet.workdir("h0") / "runs"
    bench = ["bench", "--profile", str(profile), "--hosts", "h0", "-c", "1", "--num-prompts",
             "6", "--output-len", "64", "--archive", str(tmp_path / "archive")]  # fmt: skip
    try:
        code, said, clean_peak = _cli_peak(fleet, *bench)  # the same bench, nothing planted
        assert code == 0, said
        before = set(runs.iterdir())
        planted: list[Path] = []

        def plant() -> None:  # while the run runs: a runner left a sparse file
            deadline = time.monotonic() + 60
            while not planted and time.monotonic() < deadline:
                for run in set(runs.iterdir()) - before:
                    with open(run / "left.bin", "wb") as fh:
                        os.ftruncate(fh.fileno(), 768 * MIB)
                    planted.append(run)
                time.sleep(0.02)

        planter = threading.Thread(target=plant)
        planter.start()
        code, said, peak = _cli_peak(fleet, *bench)
        planter.join()
        assert code == 0 and planted, said
        record("bounded_fetch", {"clean_peak_mib": round(clean_peak / MIB),
                                 "sparse_peak_mib": round(peak / MIB)})  # fmt: skip
        assert peak - clean_peak < GROWTH, f"{clean_peak / MIB:.0f} -> {peak / MIB:.0f} MiB"
        line = (
            f"not fetched, over the archive's bounds (128 MiB a file, 512 MiB a run): "
            f"left.bin ({768 * MIB} bytes); left on the host in {planted[0].resolve()}"
        )
        assert line in said, said
        [archived] = [p for p in (tmp_path / "archive" / "h0").iterdir()
                      if p.name == planted[0].name]  # fmt: skip
        assert not (archived / "left.bin").exists()
        assert (archived / "not-fetched.txt").read_text() == line + "\n"
    finally:
        fleet.cli("stop", "--hosts", "h0", "--grace", "1")


# -- the agent, over sshd: a run_as server that extends its log by a 1 GiB hole -------------------
HOLING_ENGINE = """#!/usr/bin/env python3
import os, sys, time
if "--help" in sys.argv:
    print("usage: engine --port PORT")
    sys.exit(0)
print("loading the model", flush=True)
os.ftruncate(1, os.fstat(1).st_size + (1 << 30))  # its stdout is the server log
print("\\nstill loading", flush=True)
time.sleep(3600)
"""


def _agents_peak(workdir: Path, stop: threading.Event, peaks: list[int]) -> None:
    """The highest VmHWM of any agent (python -I -S, in `workdir`) seen until `stop`."""
    while not stop.is_set():
        for entry in Path("/proc").iterdir():
            try:
                if not entry.name.isdigit() or os.readlink(entry / "cwd") != str(workdir):
                    continue
                argv = (entry / "cmdline").read_bytes().split(b"\0")
                if b"-S" not in argv:
                    continue
                for line in (entry / "status").read_text().splitlines():
                    if line.startswith("VmHWM:"):
                        peaks.append(int(line.split()[1]) * 1024)
            except OSError:
                continue
        time.sleep(0.02)


@pytest.mark.slow(minutes=1)
def test_a_run_as_servers_1_gib_log_hole_leaves_roots_agent_small(fleet):
    from gpufleet.sim.sshd import free_port

    folder = Path(tempfile.mkdtemp(prefix="gpufleet-hole-"))
    folder.chmod(0o755)
    engine = folder / "engine"
    engine.write_text(HOLING_ENGINE)
    engine.chmod(0o755)
    port = free_port()
    profile = fleet.profile("hole", engine="custom", health_path="/", port=port, tp=1,
                            check_flags=False, check_model_path=False,
                            command=[str(engine), "--port", "{port}"])  # fmt: skip
    fleet.write_inventory(run_as="nobody")
    stop, peaks = threading.Event(), []
    watcher = threading.Thread(target=_agents_peak, args=(fleet.workdir("h0"), stop, peaks))
    watcher.start()
    try:
        out = fleet.cli("launch", "--profile", str(profile), "--hosts", "h0", "--timeout", "4")
        said = out.stdout + out.stderr
        assert out.returncode != 0 and "not healthy after 4s" in said, said
        logs = fleet.cli("logs", "--port", str(port), "--hosts", "h0")
        assert logs.returncode == 0 and "still loading" in logs.stdout, logs.stdout
    finally:
        stop.set()
        watcher.join()
        fleet.cli("stop", "--port", str(port), "--hosts", "h0", "--grace", "1")
        shutil.rmtree(folder)
    assert peaks, "no agent was seen"
    record("bounded_agent_log_hole", {"agent_peak_mib": round(max(peaks) / MIB, 1)})
    assert max(peaks) < 64 * MIB, f"root's agent peaked at {max(peaks) / MIB:.0f} MiB"


# -- the census: the next reader goes through the bounded helpers, or says why it need not ----
# A call that reads all there is: `.read()` with no size, `read_bytes()`, `read_text()`,
# `readline()`/`readlines()` with no size, `json.load`, and output captured by subprocess.
UNBOUNDED = {"read", "read_bytes", "read_text", "readline", "readlines"}
# module:function -> why its read need not be bounded (whose file, who wrote it)
ALLOWED = {
    "host/server/state.py:_load": "root's own state file, written by this agent",
    "host/server/keys.py:read": "root's own key file (0600), written by this agent",
    "host/proc/stepkeeper.py:request": "pid and error files the job's step keeper (this agent) writes",
    "host/proc/jobstep.py:spawn": "the pid file of the srun this agent started",
    "host/proc/jobstep.py:_wait_for_pid": "the pid file of the srun this agent started",
    "host/agent/protocol.py:read_args": "the control plane's own line on stdin",
    "host/agent/procstat.py:read_stat": "/proc/PID/stat: the kernel's, one short line",
    "host/agent/procstat.py:command_name": "/proc/PID/comm: 16 bytes (its cmdline: 4 KiB)",
    "host/agent/trust.py:_pth_directories": "a .pth file of a site directory the trust rule judges",
    "host/agent/redact.py:process_secrets": "issue 80's other helper (80b) owns redact.py",
    "host/agent/safewrite.py:read_own": "a file root owns and wrote, checked before it is read",
    "host/agent/runas.py:write_files": "gpufleet's own helper, run as the user with -I",
    "host/gpu/facts.py:cpu_governor": "a sysfs file the kernel writes",
    "host/gpu/health.py:load": "root's own XID ledger, written by this agent",
    "host/gpu/health.py:_boot_id": "the kernel's boot id",
    "host/gpu/health.py:_kernel_log": "dmesg, root's own system log, 3 s at most",
    "host/bench/sglang_bench.py:run_level": "bench_serving's output and log, in the run's own dir",
    "host/bench/telemetry.py:__exit__": "the telemetry child's spool (NVML samples), its own",
    "host/bench/telemetry.py:child_main": "the runner's own job line on stdin",
    "host/bench/spread.py:child_main": "the runner's own job line on stdin",
    "host/bench/spread.py:__init__": "gpufleet's own generator processes (-I), a line each",
    "host/bench/bench_verbs.py:_spawn_runner_as": "the run's own plan and prompts, root's",
    "host/bench/bench_verbs.py:bench_run": "the run's own plan, state and keys, handed over",
    "host/bench/bench_verbs.py:_runner_alive": "root's own runner.json",
    "host/bench/bench_verbs.py:_read_status": "root's own status.json",
    "host/bench/runner.py:_read_rows": "the prompts the control plane uploaded",
    "host/bench/runner.py:run_plan": "the run's own plan.json",
    "host/bench/userrun.py:hand_over": "the agent's own zip",
}


def _unbounded_reads() -> set[str]:
    found = set()
    for path in sorted((REPO / "src" / "gpufleet" / "host").rglob("*.py")):
        rel = str(path.relative_to(REPO / "src" / "gpufleet"))
        if rel == "host/agent/bounded.py":
            continue
        tree = ast.parse(path.read_text())
        owner = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                for inner in ast.walk(node):
                    owner.setdefault(id(inner), node.name)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            sized = bool(node.args) or any(k.arg in ("size", "n") for k in node.keywords)
            captured = any(k.arg == "capture_output" for k in node.keywords) or (
                name in ("Popen", "run") and any(
                    k.arg == "stdout" and "PIPE" in ast.unparse(k.value) for k in node.keywords
                )
            )  # fmt: skip
            json_load = name == "load" and ast.unparse(func).startswith("json.")
            unbounded = (name in UNBOUNDED and not sized) or json_load or captured
            if unbounded and name not in ("urlopen",):
                found.add(f"{rel}:{owner.get(id(node), '<module>')}")
    return found


def test_every_read_in_the_agent_is_bounded_or_says_why_not():
    """A new reader of a body, a log, a user's file or a program's output must go through
    host/agent/bounded.py, or be listed above with whose input it reads; a listed reader
    that no longer reads without a bound is taken off the list."""
    found = _unbounded_reads()
    assert sorted(found - set(ALLOWED)) == [], "read without a bound (host/agent/bounded.py)"
    assert sorted(set(ALLOWED) - found) == [], "no longer reads unbounded: take it off"
