"""Issue 80, bullet 3: secrets are scrubbed without trusting their values. A run_as server
whose environment holds `EVIL_API_KEY='": "'` made every JSON line root's agent sent
unreadable (the value was scrubbed out of serialised JSON), and `inv logs` then waited 90 s
and more with no output: the control plane read an agent with no limit. Now the agent
scrubs the answer's strings before it serialises them, and every read of an agent's answer
ends, in one line naming the host and the verb, when the answer is unreadable or the agent
says nothing at all (not even its heartbeat) for the silence limit."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import pytest

from gpufleet.host.agent import redact
from helpers import HEALTH_HANDLER
from test_reliability import record

# a run_as user's server that re-executes itself with a secret-looking variable whose
# value is JSON's own punctuation: root's agent reads it from /proc/PID/environ
EVIL = (
    """#!/usr/bin/env python3
import http.server, os, sys
if "--help" in sys.argv:
    print("usage: engine --port PORT")
    sys.exit(0)
if os.environ.get("EVIL_API_KEY") != '": "':
    os.execve(sys.argv[0], sys.argv, {**os.environ, "EVIL_API_KEY": '": "'})
port = int(sys.argv[sys.argv.index("--port") + 1])
"""
    + HEALTH_HANDLER
    + """print('serving: {"model": "m"} and a secret ": " inside', flush=True)
http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
"""
)


@pytest.fixture
def evil_engine(readable_program) -> Path:
    return readable_program(EVIL)


@pytest.mark.slow(minutes=1)
def test_a_secret_made_of_json_punctuation_breaks_no_answer(fleet, evil_engine):
    profile, _ = fleet.custom_profile("evil", evil_engine)
    fleet.write_inventory(run_as="nobody")
    out = fleet.cli("launch", "--profile", str(profile), "--hosts", "h0", timeout=120)
    try:
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
        began = time.monotonic()
        logs = fleet.cli("logs", "--hosts", "h0", "--lines", "5", timeout=60)
        took = time.monotonic() - began
        said = logs.stdout + logs.stderr
        assert logs.returncode == 0, said[-2000:]
        assert "serving: {" in said and "inside" in said, said[-2000:]
        assert '": "' not in said.split("serving: ")[1].split("inside")[0].replace(
            '{"model": "m"}', ""
        ), "the secret's value itself is hidden"
    finally:
        stop = fleet.cli("stop", "--hosts", "h0", "--grace", "2", timeout=120)
    assert stop.returncode == 0, stop.stdout[-2000:] + stop.stderr[-2000:]
    record("secret_json_punctuation", {"logs_s": round(took, 1)})


# what a value may be made of to break a message serialised first and scrubbed after
PIECES = ['"', ": ", ", ", "{", "}", "[", "]", "\\", "1", "true", "null", "ok", "result",
          "gpufleet_agent", "log", "lines", " ", "\\n", "\\u00", "***"]  # fmt: skip


def test_any_secret_value_leaves_every_answer_readable_and_hides_itself():
    """Fuzz: secrets built from JSON's own pieces, in an answer that holds them in every
    place (values, lists, nested, under a secret-looking key, after a secret flag)."""
    from gpufleet.host.agent.protocol import MARK

    rng = random.Random(80)
    for _ in range(400):
        secret = "".join(rng.choice(PIECES) for _ in range(rng.randint(2, 5)))
        if len(secret) < 4 or "*" in secret:  # (*** is what a secret becomes)
            continue
        answer = {MARK: 1, "ok": True, "result": {
            "log": f"/var/log/{secret}/x", "lines": [f"a {secret} b", "plain", secret],
            "argv": ["engine", "--api-key", "abc-key-1", "--port", "1"],
            "env": {"HF_TOKEN": "tok-abc-123", "PATH": "/usr/bin"}, "n": 3, "none": None,
        }}  # fmt: skip
        line = json.dumps(redact.scrub_tree(answer, [secret]))
        back = json.loads(line)  # never unreadable, whatever the secret
        assert back[MARK] == 1 and back["ok"] is True
        shown = back["result"]
        assert shown["argv"] == ["engine", "--api-key", "***", "--port", "1"]
        assert shown["env"] == {"HF_TOKEN": "***", "PATH": "/usr/bin"}
        strings = [shown["log"], *shown["lines"]]
        assert all(secret not in s for s in strings), (secret, strings)


def _agents_in(workdir: Path) -> list[int]:
    """The serving agents running in `workdir` (root's, started over the test's sshd)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            if b"serve" in argv and Path(proc / "cwd").resolve() == workdir.resolve():
                found.append(int(proc.name))
        except (OSError, ValueError):
            continue
    return found


@pytest.mark.slow(minutes=1)
def test_a_stopped_agent_ends_the_read_in_one_line_naming_host_and_verb(fleet, evil_engine):
    """`inv logs --follow` on a quiet log is silent by right; an agent stopped there (kill
    -STOP, or a hung host) sends not even its heartbeat: the read ends after the silence
    limit, in one line, where it waited forever."""
    import os
    import signal
    import subprocess
    import sys

    from gpufleet.host.agent.heartbeat import HEARTBEAT_S, SILENT_S

    profile, _ = fleet.custom_profile("quiet", evil_engine)
    fleet.write_inventory(run_as="nobody")
    out = fleet.cli("launch", "--profile", str(profile), "--hosts", "h0", timeout=120)
    stopped: list[int] = []
    try:
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
        before = set(_agents_in(fleet.workdir("h0")))
        follow = subprocess.Popen(
            [sys.executable, "-m", "gpufleet", "logs", "--follow", "--hosts", "h0",
             "--inventory", str(fleet.inventory)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while not stopped and time.monotonic() < deadline and follow.poll() is None:
            time.sleep(0.2)
            stopped = sorted(set(_agents_in(fleet.workdir("h0"))) - before)
        assert stopped, "the follow's agent was seen"
        time.sleep(2 * HEARTBEAT_S)  # following, heartbeats sent and read: quiet is not hung
        assert follow.poll() is None, follow.communicate()
        for pid in stopped:
            os.kill(pid, signal.SIGSTOP)
        began = time.monotonic()
        stdout, stderr = follow.communicate(timeout=SILENT_S + 60)
        took = time.monotonic() - began
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
        stop = fleet.cli("stop", "--hosts", "h0", "--grace", "2", timeout=120)
    said = stdout + stderr
    assert follow.returncode == 1, said[-2000:]
    lines = [line for line in said.splitlines() if "no word from the agent" in line]
    assert len(lines) == 1 and "h0" in lines[0] and "`logs`" in lines[0], said[-2000:]
    assert "Traceback" not in said
    assert SILENT_S - HEARTBEAT_S - 1 <= took <= SILENT_S + 30, took  # heard last before
    assert stop.returncode == 0, stop.stdout[-2000:] + stop.stderr[-2000:]
    record("stopped_agent_read", {"silent_limit_s": SILENT_S, "ended_after_s": round(took, 1)})
