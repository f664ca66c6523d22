"""What a process *is*, for deciding whether gpu-clean may touch it.

A stale-server pattern is matched against what actually runs: argv[0] (where a process
title set by setproctitle lives, e.g. `sglang::scheduler_TP0`), the kernel's process name,
and for a Python interpreter the `-m` module or the script. Never against a whole command
line: `tmux new 'python -m sglang.launch_server ...'` mentions the pattern but runs tmux.
Shells, terminal multiplexers, ssh, editors and init systems never match at all.

Tenancy: a process in another PID namespace, or in a container's cgroup the agent is not
in (Docker, Kubernetes, Slurm, LXC, Podman), belongs to another tenant of the host; display
servers are never stale. Standard library only: this module ships.
"""

from __future__ import annotations

import os
import re

from gpufleet.host.agent import bounded

WRAPPERS = {
    "sh", "bash", "dash", "zsh", "fish", "ksh", "tcsh", "csh", "tmux", "screen", "SCREEN",
    "ssh", "sshd", "sshd-session", "mosh-server", "vim", "vi", "nvim", "emacs", "nano",
    "less", "more", "tail", "watch", "systemd", "init", "sudo", "su", "runuser", "login",
    "cron", "crond", "nohup", "timeout", "env", "xargs", "parallel", "srun", "salloc",
    "sbatch", "slurmstepd", "docker", "containerd-shim", "kubectl", "strace", "gdb",
}  # fmt: skip
DISPLAY_SERVERS = {
    "Xorg", "X", "Xwayland", "gnome-shell", "kwin_wayland", "kwin_x11", "sway", "weston",
    "mutter", "gdm-x-session", "sddm", "lightdm", "plasmashell", "Hyprland",
}  # fmt: skip
# The GPU's own plumbing: killing the MPS daemon ends every tenant's MPS clients; the others
# keep the driver, NVSwitch fabric and monitoring up. Matched on the program (argv[0]) or on
# the kernel's 15-byte name, which is what `nvidia-cuda-mps-server` shows as its comm.
INFRASTRUCTURE = {
    "nvidia-cuda-mps-server", "nvidia-cuda-mps-control", "nvidia-persistenced",
    "nv-fabricmanager", "nv-hostengine", "nvidia-fabricmanager", "dcgm-exporter",
}  # fmt: skip
CONTAINER_CGROUP = re.compile(r"docker|containerd|kubepods|libpod|lxc|slurm|machine\.slice")
PYTHONS = re.compile(r"^(python[0-9.]*|pypy[0-9.]*)$")


def _base(word: str) -> str:
    return os.path.basename(word.split()[0]) if word.strip() else ""


def identities(cmdline: list[str], name: str) -> list[str]:
    """What the process runs: argv[0] (or its title), its name, the Python module or script."""
    if not cmdline:
        return [name] if name else []
    out = [cmdline[0], name]
    if PYTHONS.match(_base(cmdline[0])):
        args = cmdline[1:]
        i = 0
        while i < len(args):
            arg = args[i]
            if arg == "-m" and i + 1 < len(args):
                out.append(args[i + 1])
                break
            if arg.startswith("-m") and len(arg) > 2:
                out.append(arg[2:])
                break
            if arg == "-c":
                break
            if arg in ("-X", "-W", "-Q"):
                i += 2
                continue
            if not arg.startswith("-"):
                out.append(arg)  # a script or zipapp
                break
            i += 1
    return [x for x in out if x]


def is_wrapper(cmdline: list[str], name: str) -> bool:
    """A shell, multiplexer, ssh, editor or init: runs other things, is never the server."""
    first = _base(cmdline[0]) if cmdline else name
    return first in WRAPPERS or name in WRAPPERS or first.startswith("tmux")


def matches(patterns: list[re.Pattern[str]], cmdline: list[str], name: str) -> bool:
    if is_wrapper(cmdline, name):
        return False
    ids = identities(cmdline, name)
    return any(p.search(i) for p in patterns for i in ids)


def infrastructure(cmdline: list[str], name: str) -> str | None:
    """The infrastructure program this process runs (never stale), or None."""
    program = _base(cmdline[0]) if cmdline else ""
    for known in INFRASTRUCTURE | DISPLAY_SERVERS:
        if program == known or name == known or (name and name == known[:15]):
            return known
    return None


def _read(path: str) -> str | None:
    try:
        with open(path, "rb") as fh:
            return bounded.take(fh, bounded.PROC_FILE).decode(errors="replace")
    except OSError:
        return None


def tenant(pid: int, name: str) -> str | None:
    """Why this process belongs to someone else on a shared host, or None."""
    if name in DISPLAY_SERVERS:
        return f"{name} is a display server"
    try:
        theirs, mine = os.readlink(f"/proc/{pid}/ns/pid"), os.readlink("/proc/self/ns/pid")
    except OSError:
        theirs = mine = ""
    if theirs and theirs != mine:
        return f"in another PID namespace ({theirs}: a container or sandbox)"
    cgroup, own = _read(f"/proc/{pid}/cgroup"), _read("/proc/self/cgroup")
    agent_in_container = bool(own and CONTAINER_CGROUP.search(own))
    if cgroup and cgroup != own and CONTAINER_CGROUP.search(cgroup) and not agent_in_container:
        where = cgroup.strip().splitlines()[-1].split(":", 2)[-1]
        return f"in a container cgroup ({where})"
    return None
