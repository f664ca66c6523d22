"""The census turned hostile variable by variable (issue 50, bullet 4): every variable the
loader, the C library or the interpreter acts on, as the login exports it, never reaches a
process gpufleet starts.

The list is derived, not typed: the variables the C library linked into ld.so reads (a
sorted run of NUL-separated names inside it, from GCONV_PATH), every `LD_*` and `MALLOC_*`
name the loader's binary holds, OpenSSL's, and each `PYTHON*` variable the interpreter's
`--help-env` lists. Unit half: each is unset by the remote command
(`loginenv.LOADER_VARIABLES`), or loads nothing (`loginenv.INERT_VARIABLES`), or, for
`PYTHON*`, is dropped by `env -i` and the children's allow-list. Live half: sshd's `SetEnv` gives the login all of them at once, with values
that name a marker, and a traced gpu-clean, launch, bench and stop must show no `execve`
after the remote command's `env -i` carrying any of them (the login shell's own does: the
control that they arrived).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from census import _joined
from gpufleet.host.agent import childenv, loginenv
from test_reliability import record

MARK = "/tmp/gpufleet-census-var"
OPENSSL = ("OPENSSL_CONF", "OPENSSL_MODULES", "OPENSSL_ENGINES")
# break the login itself, before any command: the shell would only list its libraries, and
# with LD_SHOW_AUXV set by sshd's SetEnv `ssh HOST 'echo hi'` (OpenSSH's own client) never
# returns here; no program of gpufleet's would run to be checked
BREAKS_THE_LOGIN = ("LD_TRACE_LOADED_OBJECTS", "LD_SHOW_AUXV")


def _loader() -> bytes:
    return Path(os.path.realpath("/lib64/ld-linux-x86-64.so.2")).read_bytes()


def libc_variables(data: bytes) -> list[str]:
    """The variables the C library in ld.so reads: the sorted NUL-separated run of names
    that starts at GCONV_PATH."""
    start = data.index(b"GCONV_PATH\0")
    names: list[str] = []
    for word in data[start:].split(b"\0"):
        # the list is sorted: the first name out of order (or no name) is past its end
        if not re.fullmatch(rb"[A-Z][A-Z0-9_]+", word) or (names and word.decode() < names[-1]):
            break
        names.append(word.decode())
    return names


def loader_variables() -> list[str]:
    """Every variable the loader and the C library act on, as their binary names them."""
    data = _loader()
    found = set(libc_variables(data))
    found |= {
        m.decode() for m in re.findall(rb"(?<![A-Z0-9_])(?:LD|MALLOC)_[A-Z0-9_]+(?=\0)", data)
    }
    found |= {"GLIBC_TUNABLES", *OPENSSL}
    return sorted(found)


def python_variables() -> list[str]:
    out = subprocess.run([sys.executable, "--help-env"], capture_output=True, text=True)
    return sorted(set(re.findall(r"^(PYTHON[A-Z_]+)", out.stdout, re.M)))


@pytest.mark.unit
def test_every_variable_the_loader_or_the_interpreter_acts_on_is_kept_from_root():
    derived = loader_variables()
    assert len(libc_variables(_loader())) >= 15 and "LD_PRELOAD" in derived
    missing = [n for n in derived if n not in loginenv.LOADER_VARIABLES
               and n not in loginenv.INERT_VARIABLES and n != "MALLOC_"]  # fmt: skip
    assert missing == [], f"unset by nobody before the agent runs: {missing}"
    pythons = python_variables()
    assert len(pythons) >= 20 and "PYTHONSTARTUP" in pythons
    kept = [n for n in pythons if not n.startswith(childenv.ANNOUNCED)]
    assert kept == [], kept


_EXECVE = re.compile(r'^execve\("([^"]*)", \[(.*?)\], \[(.*)\]\) = (-?\d+)')
_FORK = re.compile(r"^(?:clone3?|v?fork)\(.*\) = (\d+)")


def _execs(log: Path) -> list[tuple[int, str, list[str], list[str]]]:
    """(pid, program, argv, envp) of each successful execve, and which pids descend from
    the remote command's `env -i`."""
    ours: set[int] = set()
    out = []
    for pid, call in _joined(log.read_text(errors="replace").splitlines()):
        fork = _FORK.match(call)
        if fork and pid in ours:
            ours.add(int(fork.group(1)))
            continue
        match = _EXECVE.match(call)
        if not match or match.group(4) != "0":
            continue
        argv = re.findall(r'"((?:[^"\\]|\\.)*)"', match.group(2))
        envp = re.findall(r'"((?:[^"\\]|\\.)*)"', match.group(3))
        if match.group(1).endswith("/env") and "-i" in argv:
            ours.add(pid)
        out.append((pid if pid in ours else -pid, match.group(1), argv, envp))
    return out


@pytest.mark.slow(minutes=2)
def test_no_login_variable_reaches_a_process_gpufleet_starts(fleet, fresh_sshd, tmp_path):
    names = [n for n in sorted({*loader_variables(), *python_variables()})
             if n not in BREAKS_THE_LOGIN and n not in loginenv.INERT_VARIABLES
             and n != "MALLOC_"]  # fmt: skip
    setenv = " ".join(f"{n}={MARK}/{n}" for n in names)
    sshd = fresh_sshd(extra_options=[f"SetEnv={setenv}"])
    fleet.add_sshd_host("v0", sshd, 80)
    profile = fleet.profile("vars", tp=1, sim={"load-seconds": 0.2, "warmup-seconds": 0.1})
    port = yaml.safe_load(profile.read_text())["port"] + 80
    log = tmp_path / "trace"
    tracer = subprocess.Popen(["strace", "-f", "-v", "-qq", "-s", "65536", "-e",
                               "trace=execve,clone,clone3,fork,vfork", "-o", str(log),
                               "-p", str(sshd.proc.pid)], stderr=subprocess.PIPE)  # fmt: skip
    try:
        while "TracerPid:\t0\n" in Path(f"/proc/{sshd.proc.pid}/status").read_text():
            assert tracer.poll() is None, tracer.stderr.read()
        for argv in (["gpu-clean", "--hosts", "v0"],
                     ["launch", "--profile", str(profile), "--hosts", "v0", "--clean"],
                     ["bench", "--hosts", "v0", "--port", str(port), "--concurrency", "1",
                      "--num-prompts", "4", "--output-len", "8", "--archive", str(tmp_path / "a")],
                     ["stop", "--hosts", "v0", "--grace", "2"]):  # fmt: skip
            out = fleet.cli(*argv, timeout=300)
            assert out.returncode == 0, (argv, out.stdout[-1500:], out.stderr[-1500:])
    finally:
        tracer.terminate()
        tracer.wait(timeout=30)
    execs = _execs(log)
    logins = [
        e for e in execs if e[0] < 0 and any(v.startswith(f"LD_PRELOAD={MARK}") for v in e[3])
    ]
    assert logins, "the login never had the variables: the test would prove nothing"
    # `env -i` itself is a C program that clears the environment for what it runs: only
    # what the loader and the C library act on must be gone by then; from the agent's
    # python on, everything
    carried = sorted({f"{Path(prog).name}: {v.split('=')[0]}" for pid, prog, _, envp in execs
                      if pid > 0 for v in envp if f"={MARK}/" in v
                      and not (prog.endswith("/env") and v.startswith("PYTHON"))})  # fmt: skip
    gpufleets = [e for e in execs if e[0] > 0]
    assert len(gpufleets) >= 8, [e[1] for e in gpufleets]  # env, agents, server, runner...
    record("census_variables", {"variables": len(names), "processes": len(gpufleets),
                                "carried": len(carried)})  # fmt: skip
    assert carried == [], carried
