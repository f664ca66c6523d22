"""The census's tracing (tests/census.py): strace runs the census sshd from its start, a
block reads the lines its processes wrote meanwhile, and the sshd ends with its wrapper."""

from __future__ import annotations

import socket
import subprocess
import time

from census import strace_wrapper, trace_log, traced
from gpufleet.sim.sshd import LoopbackSshd
from helpers import pid_alive


def test_an_sshd_run_under_strace_stops_with_it_and_leaves_no_listener(tmp_path, ssh_keys):
    """strace ignores SIGTERM while it runs a program and runs sshd as its child: stopping
    only the wrapper left the listener on its port (sshd retitles it, so its words are
    spaces apart, not NULs)."""
    sshd = LoopbackSshd(tmp_path / "s", ssh_keys, wrapper=strace_wrapper(tmp_path / "t")).start()
    pidfile = tmp_path / "s" / "sshd.pid"
    deadline = time.monotonic() + 10
    while not pidfile.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    listener = int(pidfile.read_text())
    assert listener != sshd.proc.pid  # strace's child
    assert trace_log(sshd) == tmp_path / "t"
    sshd.stop()
    deadline = time.monotonic() + 10
    while pid_alive(listener) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not pid_alive(listener)
    assert sshd.proc.poll() is not None
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", sshd.port)) != 0


def test_a_traced_block_holds_the_calls_made_within_it_and_no_others(tmp_path):
    log, fifo = tmp_path / "trace", tmp_path / "go"
    subprocess.run(["mkfifo", str(fifo)], check=True)
    script = f"cat /etc/hostname >/dev/null; read x < {fifo}; cat /etc/passwd >/dev/null"
    proc = subprocess.Popen([*strace_wrapper(log), "sh", "-c", script])
    try:
        deadline = time.monotonic() + 10
        # cat's open of the file, not only its execve, which names it too (beside eight
        # workers the block began between the two and held the open)
        opened = b'"/etc/hostname", O_RDONLY'
        while (not log.exists() or opened not in log.read_bytes()) and (
            time.monotonic() < deadline
        ):
            time.sleep(0.02)
        with traced(log, tmp_path / "block") as block:
            fifo.write_text("go\n")
            proc.wait(10)
    finally:
        proc.kill()
    within = block.read_text()
    assert "/etc/passwd" in within and "/etc/hostname" not in within
    assert within.endswith("\n") and all(line[:1].isdigit() for line in within.splitlines())
