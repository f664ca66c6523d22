"""The environment of everything the agent starts: an allow-list, never the login's whole.

The agent runs isolated (`python -I`), but what it spawns as root (the engine's `--help`
preflight, the version probe, the server and its ranks, bench_serving, dmesg) would read
PYTHONPATH, PYTHONSTARTUP, LD_PRELOAD and the like from root's login (/etc/environment,
~/.bashrc, sshd's SetEnv): a `sitecustomize.py` in a directory another user owns would run
as root in each of them. So children start from the allow-list below; a kept variable
whose value names a path that fails the trust rule is dropped too (PATH loses only those
entries). Variables a profile sets explicitly are kept, and every path they name must pass
the rule, or the launch is refused. Standard library only: this module ships.
"""

from __future__ import annotations

import os
import re

from gpufleet.host.agent import loginenv, trust

KEEP = {"PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TERM", "TZ",
        "http_proxy", "https_proxy", "no_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY",
        "NO_PROXY", "ALL_PROXY"}  # fmt: skip
# what GPU servers are configured by (a value naming a path is judged like the rest)
KEEP_PREFIXES = ("LC_", "CUDA_", "NVIDIA_", "NCCL_", "HF_", "HUGGING_FACE_", "SGLANG_",
                 "GPUFLEET_", "OMP_", "TOKENIZERS_", "TORCH_", "TORCHINDUCTOR_", "TRITON_",
                 "FLASHINFER_", "MASTER_", "GLOO_", "UCX_", "NVSHMEM_")  # fmt: skip
ANNOUNCED = ("PYTHON", "LD_", "PERL5", "RUBY", "NODE_", "BASH_ENV", "GCONV_PATH")
# the login session's own (sshd's, the shell's, a Slurm step's): never a server's setting,
# so not worth a word when they are not passed
SESSION = {"PWD", "OLDPWD", "SHLVL", "_", "MAIL", "MOTD_SHOWN", "DBUS_SESSION_BUS_ADDRESS",
           "LS_COLORS", "HOSTNAME", "HOSTTYPE", "OSTYPE", "MACHTYPE", "LESSOPEN",
           "LESSCLOSE"}  # fmt: skip
SESSION_PREFIXES = ("SSH_", "XDG_", "SLURM_", "SLURMD_", "BASH_FUNC_")
ZONEINFO = "/usr/share/zoneinfo"  # where the C library reads a relative TZ (TZDIR is unset)
SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


# Every reader's separators at once: ld.so splits LD_PRELOAD on spaces and colons, search
# paths on colons, many tools take commas or `;`, options `key=value`. A value is judged by
# every absolute path any of them could read in it, never by how one of them splits it.
_SEPARATORS = re.compile(r"[\s:;,=]+")


def _paths_in(value: str) -> list[str]:
    """Every path a reader could take from `value`, absolute: a relative one (a word with
    a `/`: `../foreign/evil.so`; a word without one is looked up on a search path, never
    in the directory) is resolved against the directory the server starts in, this
    agent's (issue 68.2: libcuda loaded CUDA_INJECTION64_PATH=../foreign/evil.so from
    the server's cwd, and only absolute paths were judged)."""
    here = os.getcwd()
    out = []
    for word in _SEPARATORS.split(value):
        if word.startswith("/"):
            out.append(word)
        elif "/" in word:
            out.append(os.path.normpath(os.path.join(here, word)))
    return out


def _tz_paths(value: str) -> list[str]:
    """The file a TZ value makes the C library read: `:/path` or `/path` itself, and a
    relative name (`Europe/Paris`, `:Etc/UTC`) under the zoneinfo folder, never under the
    directory the server starts in; a POSIX rule (`CET-1CEST`) reads none."""
    name = value.removeprefix(":")
    if name.startswith("/"):
        return [name]
    if not name or (not value.startswith(":") and "/" not in name):
        return []
    return [os.path.normpath(os.path.join(ZONEINFO, name))]


def untrusted_paths(value: str, name: str = "") -> list[str]:
    """The one-line reasons the paths a value names fail the trust rule (a missing path
    passes only where no other user could create it); TZ's as the C library reads it."""
    uid = os.geteuid()
    out = []
    for path in _tz_paths(value) if name == "TZ" else _paths_in(value):
        reason = trust.trusted(path, uid, trust.ANY)
        if reason:
            out.append(reason)
    return out


def _trusted_path(value: str) -> str:
    uid = os.geteuid()
    kept = [
        p
        for p in value.split(os.pathsep)
        if p.startswith("/") and not trust.trusted(p, uid, trust.ANY)
    ]
    return os.pathsep.join(kept) or SAFE_PATH


def login_env(source: dict[str, str] | None = None) -> tuple[dict[str, str], list[str]]:
    """The allow-listed part of the login environment, and the names worth saying were
    dropped (code-loading variables, and those naming an untrusted path)."""
    unset: list[str] = []
    if source is None:
        source, unset = loginenv.login_environment()
    env: dict[str, str] = {}
    dropped: list[str] = list(unset)  # what the login shell unset before the agent ran
    for name, value in source.items():
        if name == "PATH":
            env[name] = _trusted_path(value)
        elif name in KEEP or name.startswith(KEEP_PREFIXES):
            if untrusted_paths(value, name):
                dropped.append(name)
            else:
                env[name] = value
        elif name.startswith(ANNOUNCED) or not _session(name):
            dropped.append(name)  # said in the dry run, with why (dropped_note)
    env.setdefault("PATH", SAFE_PATH)
    return env, sorted(dropped)


def _session(name: str) -> bool:
    return name in SESSION or name.startswith(SESSION_PREFIXES)


def _loads_code(name: str) -> bool:
    return name in loginenv.LOADER_VARIABLES or name.startswith(ANNOUNCED)


def child_env(explicit: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for a child of the agent: the clean login part plus `explicit`
    (judged by the caller with `refusals`), and never a user site: a bare interpreter's
    `~/.local/lib/pythonX.Y/site-packages` (its `.pth` files and `usercustomize`) would
    run in the preflight, the server and every rank, judged by nothing."""
    env, _ = login_env()
    env.update(explicit or {})
    env["PYTHONNOUSERSITE"] = "1"
    return env


def refusals(explicit: dict[str, str]) -> list[str]:
    """Why a profile's own variables cannot be given to a root process, one line each."""
    out = []
    for name, value in explicit.items():
        out += [f"env {name}: {reason}" for reason in untrusted_paths(str(value), name)]
    return out


def dropped_names() -> tuple[list[str], list[str]]:
    """What the login set that children will not get, in two kinds: (variables naming a
    path another user may write: a fact about the host to fix, said at every launch;
    code-loading variables with harmless values: said where they may matter, when a
    launch fails and in its dry run)."""
    source, unset = loginenv.login_environment()
    _, dropped = login_env(source)
    unsafe = sorted({n for n in dropped if n in source and untrusted_paths(source[n], n)})
    return unsafe, sorted({*unset, *dropped} - set(unsafe))


def dropped_note(names: list[str], why: str = "") -> str | None:
    """One line naming variables not passed to the server, each kind with why, and how to
    pass them (issue 80.6: TZ and CUDA_INJECTION64_PATH went unsaid)."""
    if not names:
        return None
    if why:
        said = f"{', '.join(names)}{why}"
    else:
        kinds = (
            ([n for n in names if _loads_code(n)], " (they load code or steer the loader)"),
            ([n for n in names if not _loads_code(n)], " (not on the allow-list: "
             "host/agent/childenv.py)"),
        )  # fmt: skip
        said = "; ".join(f"{', '.join(group)}{because}" for group, because in kinds if group)
    return (
        f"not passed to the server from the login environment: {said} "
        "(set them under the profile's env: to pass them; their paths are judged)"
    )


def unsafe_notes(names: list[str]) -> list[str]:
    """The line said at every launch for variables naming a path another user may write."""
    note = dropped_note(names, " (they name a path another user may write)")
    return [note] if note else []
