"""Issue 80, bullet 1: the measured server is the launched server. Another local user
(nobody) binds the port of root's server over a real sshd: wait-ready, bench-start and the
runner's every level and keyed request refuse in one line naming the port, the squatter's
pid and its user, and the squatter receives nothing, not even the API key. A server
benched on purpose with --url says so in its manifest."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import run_cli
from test_reliability import record

NOBODY = 65534
CANARY = "CANARYlisten5e1d"

# a custom engine: "loading" binds nothing yet (a model still loading); otherwise it serves
# /health, and GET /close shuts its listening socket while the process runs on
ENGINE = """#!/usr/bin/env python3
import http.server, sys, threading, time
if "--help" in sys.argv:
    print("usage: engine --port PORT --mode MODE --api-key KEY")
    sys.exit(0)
port = int(sys.argv[sys.argv.index("--port") + 1])
if "loading" in sys.argv:
    time.sleep(3600)
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ok")
        if self.path == "/close":
            threading.Thread(target=lambda: (srv.shutdown(), srv.server_close())).start()
    def log_message(self, *args):
        pass
srv = http.server.HTTPServer(("127.0.0.1", port), Health)
srv.serve_forever()
print("closed its port, still running", flush=True)
time.sleep(3600)
"""

# another user's server on the same port: answers everything, writes down what it got
SQUATTER = textwrap.dedent(
    """
    import http.server, sys
    seen = open(sys.argv[2], "a")
    class Any(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            seen.write(f"{self.command} {self.path} {self.headers.get('Authorization')}\\n")
            seen.flush()
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b'{"model_path": "the-squatters-model"}')
        do_POST = do_GET
        def log_message(self, *args):
            pass
    srv = http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Any)
    print("listening", flush=True)
    srv.serve_forever()
    """
)


@pytest.fixture
def engine(readable_program) -> Path:
    return readable_program(ENGINE)


@pytest.fixture
def squat() -> Iterator:
    """Start nobody's server on a port: (its process, the file of what it received)."""
    folder = Path(tempfile.mkdtemp(prefix="gpufleet-squat-"))
    folder.chmod(0o777)
    started: list[subprocess.Popen] = []

    def start(port: int, uid: int = NOBODY) -> tuple[subprocess.Popen, Path]:
        seen = folder / "seen.txt"
        seen.touch()
        seen.chmod(0o666)
        proc = subprocess.Popen(
            ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
             "/usr/bin/python3", "-c", SQUATTER, str(port), str(seen)],
            stdout=subprocess.PIPE, text=True, cwd="/",
        )  # fmt: skip
        started.append(proc)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "listening"
        return proc, seen

    yield start
    for proc in started:
        proc.kill()
        proc.wait()
    shutil.rmtree(folder)


def _profile(fleet, engine: Path, mode: str):
    return fleet.custom_profile(f"squat{mode}", engine, check_flags=False, health_timeout=2,
                                flags={"mode": mode, "api-key": CANARY})  # fmt: skip


def _state(fleet, port: int) -> dict:
    return json.loads((fleet.workdir("h0") / "servers" / f"{port}.json").read_text())


@pytest.mark.slow(minutes=1)
def test_a_squatter_on_a_loading_servers_port_is_never_called_ready(fleet, engine, squat):
    profile, port = _profile(fleet, engine, "loading")
    out = fleet.cli("launch", "--profile", str(profile), "--hosts", "h0", "--timeout", "1")
    try:
        assert out.returncode != 0 and "not healthy after 1s" in out.stdout + out.stderr
        server = _state(fleet, port)["pid"]
        proc, seen = squat(port)  # nobody binds the port while root's server still loads
        out = fleet.cli("wait", "--port", str(port), "--hosts", "h0", "--timeout", "10")
        said = out.stdout + out.stderr
        assert out.returncode != 0, said
        line = (f"port {port} is listened on by pid {proc.pid} (user nobody), not by the "
                f"server gpufleet launched (pid {server}): refused, nothing sent to it")  # fmt: skip
        assert line in said and "ready" not in said.split(line)[0][-200:], said
        assert "Traceback" not in said
        assert seen.read_text() == ""  # not even /health
        record("port_squat_wait", {"refused": True, "requests_to_squatter": 0})
    finally:
        fleet.cli("stop", "--port", str(port), "--hosts", "h0", "--grace", "1")


@pytest.mark.slow(minutes=1)
def test_a_bench_refuses_a_port_another_user_took_and_sends_it_no_key(fleet, engine, squat):
    import urllib.request

    profile, port = _profile(fleet, engine, "serving")
    out = fleet.cli("launch", "--profile", str(profile), "--hosts", "h0")
    try:
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
        server = _state(fleet, port)["pid"]
        urllib.request.urlopen(f"http://127.0.0.1:{port}/close", timeout=5).read()
        proc, seen = squat(port)  # the server runs on, its port now nobody's
        out = fleet.cli("bench", "--profile", str(profile), "--hosts", "h0", "-c", "1",
                        "--num-prompts", "1", "--output-len", "4", "--archive",
                        str(fleet.root / "archive"))  # fmt: skip
        said = out.stdout + out.stderr
        assert out.returncode != 0, said
        assert (f"port {port} is listened on by pid {proc.pid} (user nobody), not by the "
                f"server gpufleet launched (pid {server})") in said  # fmt: skip
        assert "Traceback" not in said and CANARY not in said
        assert seen.read_text() == ""  # no request, no key
        record("port_squat_bench", {"refused": True, "requests_to_squatter": 0})
    finally:
        fleet.cli("stop", "--port", str(port), "--hosts", "h0", "--grace", "1")


def test_the_runner_sends_no_level_and_no_keyed_request_to_a_foreign_listener(squat, tmp_path):
    """The runner's own checks (the server's state handed to it says which tree is ours):
    /server_info before and after and every level are refused, the run fails in one line."""
    from gpufleet.host.agent.procstat import ProcRef
    from gpufleet.host.bench.runner import run_plan
    from gpufleet.records import BenchPlan, Level, ServerState
    from gpufleet.sim.sshd import free_port

    port = free_port()
    ours = subprocess.Popen(["sleep", "60"], start_new_session=True)  # the launched tree
    try:
        proc, seen = squat(port)
        plan = BenchPlan(run_id="r1", levels=[Level(concurrency=1, num_prompts=1)],
                         base_url=f"http://127.0.0.1:{port}", output_len=4)  # fmt: skip
        (tmp_path / "plan.json").write_text(plan.to_json())
        (tmp_path / "prompts.jsonl").write_text(json.dumps({"prompt": "hi"}) + "\n")
        state = ServerState(pid=ours.pid, pgid=ours.pid, port=port, log=str(tmp_path / "log"),
                            health_url=f"http://127.0.0.1:{port}/health", profile="p",
                            engine="custom", argv=[], env={}, started_at="now", status="ready",
                            proc=ProcRef.capture(ours.pid).to_wire())  # fmt: skip
        status = run_plan(tmp_path, state, keys={"api-key": CANARY})
        assert status["status"] == "failed"
        assert status["reason"] == (
            f"port {port} is listened on by pid {proc.pid} (user nobody), not by the server "
            f"gpufleet launched (pid {ours.pid}): refused, nothing sent to it"
        )
        assert seen.read_text() == ""
        assert json.loads((tmp_path / "server_info_before.json").read_text()) is None
    finally:
        ours.kill()
        ours.wait()


CHECK_AS_NOBODY = """
import json, sys
sys.path.insert(0, sys.argv[1])
from gpufleet.host.server import listener
from gpufleet.records import ServerState
print(json.dumps(listener.refusal_for(ServerState.from_wire(json.loads(sys.argv[2])))))
"""


def test_a_runner_as_the_run_as_user_trusts_only_the_sockets_root_checked(squat):
    """The runner as nobody cannot read root's server's descriptors: root hands it the
    inodes it found the server's (SOCKETS_ENV); a socket nobody cannot read that is not one
    of them is "a process of another user" (here daemon's)."""
    from gpufleet.host.server import listener
    from gpufleet.records import ServerState
    from gpufleet.sim.sshd import free_port

    port = free_port()
    serve = f"import socket, time; s = socket.create_server(('127.0.0.1', {port})); " \
            "print('up', flush=True); time.sleep(60)"  # fmt: skip
    server = subprocess.Popen(["/usr/bin/python3", "-c", serve], stdout=subprocess.PIPE,
                              text=True, start_new_session=True)  # fmt: skip
    assert server.stdout is not None and server.stdout.readline().strip() == "up"
    state = ServerState(pid=server.pid, pgid=server.pid, port=port, profile="p", engine="sim",
                        health_url="", log="", started_at="")  # fmt: skip

    def check_as_nobody(sockets: str) -> str | None:
        out = subprocess.run(
            ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
             "/usr/bin/python3", "-c", CHECK_AS_NOBODY, str(Path(listener.__file__).parents[3]),
             json.dumps(state.to_wire())],
            capture_output=True, text=True, cwd="/",
            env={"PATH": "/usr/bin:/bin", listener.SOCKETS_ENV: sockets},
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    try:
        sockets = listener.sockets_of(state)  # root's view, as bench-start hands it over
        assert sockets and check_as_nobody(sockets) is None
        assert "a process of another user" in (check_as_nobody("") or "")  # unreadable
        server.kill()
        server.wait()
        _proc, seen = squat(port, uid=1)  # daemon takes the port
        assert check_as_nobody(sockets) == (
            f"port {port} is listened on by a process of another user, not by the server "
            f"gpufleet launched (pid {server.pid}): refused, nothing sent to it"
        )
        assert seen.read_text() == ""
    finally:
        server.kill()
        server.wait()


def test_the_rule_reads_both_tables_and_the_whole_tree(tmp_path):
    """A listener held by a child of the launched process (SGLang's HTTP server may be one)
    is ours; the same socket seen from a process outside the tree is not; IPv6 too."""
    import socket

    from gpufleet.host.server import listener

    for family, address in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
        sock = socket.socket(family)
        sock.bind((address, 0))
        sock.listen()
        port = sock.getsockname()[1]
        child = subprocess.Popen(["sleep", "30"], pass_fds=(sock.fileno(),))
        try:
            sock.close()  # only the child (of this process) holds it now
            assert listener.refusal(port, os.getpid(), os.getpgid(0)) is None
            outsider = subprocess.Popen(["sleep", "30"], start_new_session=True)
            said = listener.refusal(port, outsider.pid, outsider.pid)
            outsider.kill()
            outsider.wait()
            assert said and f"pid {child.pid} (user root)" in said, said
        finally:
            child.kill()
            child.wait()
    assert listener.refusal(port, os.getpid(), os.getpgid(0)) is None  # nobody listens


def test_a_server_benched_on_purpose_by_url_says_so_in_the_manifest(sim_server, tmp_path):
    server = sim_server()
    out = run_cli("bench", "--client", "local", "--url", server.url, "-c", "1",
                  "--num-prompts", "2", "--output-len", "4", "--archive", str(tmp_path))  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    [run_dir] = list((tmp_path / f"127.0.0.1_{server.port}").iterdir())
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["server_origin"] == (
        f"launched outside gpufleet, benched on purpose at {server.url} (--url): whose "
        "server answers there was not checked"
    )
