"""host/proc/procfs.py reads /proc as psutil did for the agent (issue 50: the agent imports
nothing from a venv or site directory, and psutil was the one it did). The reference is
psutil itself, on every process of this machine at once, including titles written over
argv, zombies, other users' processes and a real listening socket."""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time

import psutil
import pytest

from gpufleet.host.proc import procfs

pytestmark = pytest.mark.unit


@pytest.fixture
def odd_processes():
    """A process titled over its argv, a zombie, one of another user, one listening on v4
    and v6, and one with a name longer than the kernel keeps."""
    titled = subprocess.Popen([sys.executable, "-c", (  # as SGLang's schedulers title theirs
        "import setproctitle, time\n"
        "setproctitle.setproctitle('sglang::scheduler_TP0 rank 0')\n"
        "time.sleep(60)")])  # fmt: skip
    zombie = subprocess.Popen(["true"])
    other = subprocess.Popen(["sleep", "60"], user=65534, group=65534)
    listener = subprocess.Popen([sys.executable, "-c", (
        "import socket, time\n"
        "a = socket.socket(); a.bind(('127.0.0.1', 0)); a.listen()\n"
        "b = socket.socket(socket.AF_INET6); b.bind(('::1', 0)); b.listen()\n"
        "print(a.getsockname()[1], b.getsockname()[1], flush=True); time.sleep(60)")],
        stdout=subprocess.PIPE, text=True)  # fmt: skip
    ports = [int(p) for p in listener.stdout.readline().split()]
    long_name = "/tmp/gpufleet-a-rather-long-program-name"
    os.symlink("/bin/sleep", long_name) if not os.path.exists(long_name) else None
    named = subprocess.Popen([long_name, "60"])
    time.sleep(0.3)  # the zombie has exited, unreaped
    yield {"zombie": zombie.pid, "other": other.pid, "listener": (listener.pid, ports),
           "named": named.pid, "titled": titled.pid}  # fmt: skip
    for proc in (titled, other, listener, named):
        proc.kill()
        proc.wait()
    zombie.wait()


def _psutil_view(pid: int) -> tuple:
    ref = psutil.Process(pid)
    with ref.oneshot():
        return (ref.ppid(), ref.name(), ref.cmdline(), ref.uids().real, ref.username(),
                ref.status(), ref.create_time())  # fmt: skip


def _same(pid: int, tries: int = 3) -> None:
    """procfs's view equals psutil's just before or just after it (a process may exec or
    change state between two reads on a busy machine); a kernel worker that changes its
    name and state between all three reads (kworker/0:1+events... <-> -events..., idle <->
    running: CI of e438bac) is read again, at most `tries` times: a real difference stays."""
    for attempt in range(tries):
        try:
            before = _psutil_view(pid)
            mine = procfs.Process(pid)
            got = (mine.ppid(), mine.name(), mine.cmdline(), mine.uid(), mine.username(),
                   mine.status(), mine.create_time())  # fmt: skip
            after = _psutil_view(pid)
        except (psutil.NoSuchProcess, procfs.NoSuchProcess, psutil.ZombieProcess):
            return  # gone while comparing
        if got[:6] in (before[:6], after[:6]) or attempt == tries - 1:
            break
    assert got[:6] in (before[:6], after[:6]), (pid, got, before, after)
    assert abs(got[6] - before[6]) < 0.05, (pid, got[6], before[6])


def test_every_process_reads_as_psutil_reads_it(odd_processes):
    listed_before = set(psutil.pids())
    pids = [p.pid for p in procfs.process_iter()]
    stable = listed_before & set(psutil.pids())  # alive all through the listing
    wanted = [v for k, v in odd_processes.items() if k != "listener"]
    assert set(wanted) <= set(pids)
    assert stable <= set(pids), sorted(stable - set(pids))
    for pid in pids:
        _same(pid)
    assert procfs.Process(odd_processes["zombie"]).status() == "zombie"
    assert procfs.Process(odd_processes["other"]).uid() == 65534
    assert procfs.Process(odd_processes["named"]).name() == "gpufleet-a-rather-long-program-name"
    if importlib.util.find_spec("setproctitle"):  # the dev extra has it; a GPU box may not
        titled = procfs.Process(odd_processes["titled"])
        assert titled.cmdline()[0].startswith("sglang::scheduler_TP0"), titled.cmdline()


def test_family_and_listening_ports_match_psutil(odd_processes):
    me = procfs.Process()
    assert [p.pid for p in me.parents()] == [p.pid for p in psutil.Process().parents()]
    mine = sorted(p.pid for p in me.children(recursive=True))
    assert mine == sorted(p.pid for p in psutil.Process().children(recursive=True))
    pid, ports = odd_processes["listener"]
    assert sorted(procfs.Process(pid).listening()) == sorted(
        [("127.0.0.1", ports[0]), ("::1", ports[1])]
    )


def test_a_signal_never_reaches_a_pid_that_was_reused():
    """The PID is pinned to its start time: after the process is gone, a signal to the
    old handle is refused, whoever holds the number now."""
    proc = subprocess.Popen(["sleep", "60"])
    handle = procfs.Process(proc.pid)
    handle.terminate()
    proc.wait()
    with pytest.raises(procfs.NoSuchProcess):
        handle.kill()
    with pytest.raises(procfs.NoSuchProcess):
        procfs.Process(proc.pid)
    handle.start_ticks -= 1  # as if a new process now held its number
    live = subprocess.Popen(["sleep", "60"])
    handle.pid = live.pid
    with pytest.raises(procfs.NoSuchProcess):
        handle.send_signal(signal.SIGKILL)
    assert live.poll() is None
    live.kill()
    live.wait()


def test_a_listener_in_the_agents_own_namespace_is_found_on_ipv4_any():
    with socket.socket() as server:
        server.bind(("0.0.0.0", 0))
        server.listen()
        port = server.getsockname()[1]
        assert ("0.0.0.0", port) in procfs.Process().listening()


def test_a_zombie_named_like_a_server_is_not_a_stale_server(tmp_path):
    """Found on the lent H100: after `inv stop`, `inv gpu-clean` said "5000 exited by itself: "
    (no command) of the stopped llama-server, a zombie its container's PID 1 never reaped.
    A zombie holds nothing and no signal reaches it: the pattern search skips it."""
    import shutil
    from pathlib import Path

    from gpufleet.host.proc.gpuprocs import find_pattern_matches

    program = tmp_path / "llama-server"
    shutil.copy(shutil.which("sleep"), program)
    parent = subprocess.Popen(  # a parent that never reaps its child: the child stays a zombie
        [sys.executable, "-c", "import subprocess, sys, time; "
         "c = subprocess.Popen([sys.argv[1], '300']); print(c.pid, flush=True); "
         "time.sleep(300)", str(program)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        child = int(parent.stdout.readline())
        assert child in find_pattern_matches([r"(^|/)llama-server$"], None)
        os.kill(child, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while Path(f"/proc/{child}/stat").read_text().split(") ")[1][0] != "Z":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert child not in find_pattern_matches([r"(^|/)llama-server$"], None)
    finally:
        parent.kill()
        parent.wait()
