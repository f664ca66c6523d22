"""Issue 50, bullet 1: root's agent imports only the standard library and what its zip brings.

It ran as `python -I`: `site` still ran, every `.pth` line of the host venv executed as root
and psutil (with its compiled module) and pynvml were imported from the venv's
site-packages. Now it runs `python -I -S`, reads processes from /proc and brings NVML's
binding in the zip. The kernel's view decides (strace on a real sshd, every process it
forks): no file under the host python's site directories is opened by the agent or by the
GPU sampler it starts, through a gpu-clean, a launch, a bench and a stop; the bench runner,
which still starts the host python normally, is the control that shows the trace sees such
opens.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from census import _joined, strace_wrapper, trace_log, traced

# a module, its bytecode or a compiled extension; the bootstrap reads `.pth` files as text
# (trust.site_directories: the directories they add are judged), it never runs them
IMPORTS = (".py", ".pyc", ".so")
_EXEC = re.compile(r'^execve\("([^"]+)", \[(.*?)\]')
_OPEN = re.compile(r'^openat\([^"]*"([^"]+)"[^)]*\) = (\d+)')


def _site_dirs(python: str) -> list[str]:
    out = subprocess.run([python, "-I", "-c", "import site, sys; print('\\n'.join(sys.path))"],
                         capture_output=True, text=True, check=True)  # fmt: skip
    return [p for p in out.stdout.split() if "site-packages" in p or "dist-packages" in p]


def _imports_by_role(log: Path, site: list[str]) -> dict[str, set[str]]:
    """Files under `site` opened for import, by the role of the process that opened them:
    `agent` (a python started with -S: the bootstrap, the agent, the GPU sampler), `other`
    (any other program after its execve)."""
    role: dict[int, str] = {}
    found: dict[str, set[str]] = {"agent": set(), "other": set(), "agents_seen": set()}
    for pid, call in _joined(log.read_text(errors="replace").splitlines()):
        exec_match = _EXEC.match(call)
        if exec_match and "= 0" in call.rsplit(")", 1)[-1]:
            argv = re.findall(r'"((?:[^"\\]|\\.)*)"', exec_match.group(2))
            isolated = "-S" in argv[1:3] and "-I" in argv[1:3]
            role[pid] = "agent" if isolated else "other"
            if isolated:
                found["agents_seen"].add(str(pid))
            continue
        opened = _OPEN.match(call)
        if opened and pid in role and opened.group(1).endswith(IMPORTS):
            path = opened.group(1)
            if any(path.startswith(d + "/") for d in site):
                found[role[pid]].add(path)
    return found


@pytest.mark.slow(minutes=2)
def test_the_agent_imports_nothing_from_the_host_pythons_site_directories(
    fleet, fresh_sshd, tmp_path, host_python
):
    sshd = fresh_sshd(wrapper=strace_wrapper(tmp_path / "iso.strace"))
    fleet.add_sshd_host("iso", sshd, 75)
    profile = fleet.profile("iso", tp=1, sim={"load-seconds": 0.2, "warmup-seconds": 0.1})
    port = yaml.safe_load(profile.read_text())["port"] + 75
    site = _site_dirs(host_python)
    assert site, "the host venv has a site directory"
    log = tmp_path / "trace"
    with traced(trace_log(sshd), log):
        for argv in (["gpu-clean", "--hosts", "iso"],
                     ["launch", "--profile", str(profile), "--hosts", "iso", "--clean"],
                     ["bench", "--hosts", "iso", "--port", str(port), "--concurrency", "1",
                      "--num-prompts", "4", "--output-len", "8", "--archive",
                      str(tmp_path / "a")],
                     ["stop", "--hosts", "iso", "--grace", "2"]):  # fmt: skip
            out = fleet.cli(*argv, timeout=300)
            assert out.returncode == 0, (argv, out.stdout[-2000:], out.stderr[-2000:])
    found = _imports_by_role(log, site)
    assert len(found["agents_seen"]) >= 4, found["agents_seen"]  # an agent per task, a sampler
    assert found["other"], "the bench runner imports from the venv: the trace sees it"
    assert found["agent"] == set(), sorted(found["agent"])[:20]
