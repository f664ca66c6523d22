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


def untrusted_paths(value: str) -> list[str]:
    """The one-line reasons the paths a value names fail the trust rule (a missing path
    passes only where no other user could create it)."""
    uid = os.geteuid()
    out = []
    for path in _paths_in(value):
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
            if untrusted_paths(value):
                dropped.append(name)
            else:
                env[name] = value
        elif name.startswith(ANNOUNCED):
            dropped.append(name)
    env.setdefault("PATH", SAFE_PATH)
    return env, sorted(dropped)


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
        out += [f"env {name}: {reason}" for reason in untrusted_paths(str(value))]
    return out


def dropped_names() -> tuple[list[str], list[str]]:
    """What the login set that children will not get, in two kinds: (variables naming a
    path another user may write: a fact about the host to fix, said at every launch;
    code-loading variables with harmless values: said where they may matter, when a
    launch fails and in its dry run)."""
    source, unset = loginenv.login_environment()
    _, dropped = login_env(source)
    unsafe = sorted({n for n in dropped if n in source and untrusted_paths(source[n])})
    return unsafe, sorted({*unset, *dropped} - set(unsafe))


def dropped_note(names: list[str], why: str = "") -> str | None:
    """One line naming variables not passed to the server, and how to pass them."""
    if not names:
        return None
    return (
        f"not passed to the server from the login environment: {', '.join(names)}{why} "
        "(set them under the profile's env: to pass them; their paths are judged)"
    )


def unsafe_notes(names: list[str]) -> list[str]:
    """The line said at every launch for variables naming a path another user may write."""
    note = dropped_note(names, " (they name a path another user may write)")
    return [note] if note else []
