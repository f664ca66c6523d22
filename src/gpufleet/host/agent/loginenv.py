"""The login's environment as the remote command handed it over, not as the agent runs in.

The agent starts in an empty environment (`env -i` with a fixed PATH, HOME and locale:
control/connect/base.py), so nothing the login exports (a module system's LD_LIBRARY_PATH,
a user's rc with LD_PRELOAD) loads into it. Its children still get the allow-listed part of
the login's variables (host/agent/childenv.py): the shell hands them over as the text of
its own `export -p` (a builtin: no program runs with the login's loader variables), and the
names of the loader and library variables it unset first.

Standard library only: this module ships.
"""

from __future__ import annotations

import os
import shlex

LOGIN_ENV = "GPUFLEET_LOGIN_ENV"  # the login shell's `export -p`
LOGIN_UNSET = "GPUFLEET_LOGIN_UNSET"  # the loader and library variables it had, unset
HANDOVER = (LOGIN_ENV, LOGIN_UNSET)
CLEAN = ("PATH", "HOME", "LANG")  # what the remote command's `env -i` sets
# What the dynamic loader (ld.so(8)) and the C library read from the environment before a
# program's first line, and the libraries a program may load on their word: unset by the
# login shell (a builtin) before anything is executed.
LOADER_VARIABLES = (
    "LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "LD_BIND_NOT", "LD_BIND_NOW", "LD_DEBUG",
    "LD_DEBUG_OUTPUT", "LD_DYNAMIC_WEAK", "LD_HWCAP_MASK", "LD_ORIGIN_PATH",
    "LD_POINTER_GUARD", "LD_PREFER_MAP_32BIT_EXEC", "LD_PROFILE", "LD_PROFILE_OUTPUT",
    "LD_SHOW_AUXV", "LD_TRACE_LOADED_OBJECTS", "LD_USE_LOAD_BIAS", "LD_VERBOSE", "LD_WARN",
    "LD_ASSUME_KERNEL", "LD_LIBRARY_PATH_64", "LD_PRELOAD_64", "GLIBC_TUNABLES",
    "MALLOC_CHECK_", "MALLOC_PERTURB_", "MALLOC_TRACE", "GCONV_PATH", "LOCPATH", "NLSPATH",
    "OPENSSL_CONF", "OPENSSL_MODULES", "OPENSSL_ENGINES", "HOSTALIASES", "RESOLV_HOST_CONF",
    "LOCALDOMAIN", "TZDIR", "BASH_ENV", "ENV", "GETCONF_DIR", "NIS_PATH", "RES_OPTIONS",
    "TMPDIR", "MALLOC_ARENA_MAX", "MALLOC_ARENA_TEST", "MALLOC_MMAP_MAX_",
    "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_TRIM_THRESHOLD_",
    "GMON_OUTPUT_PREFIX", "HESIOD_CONFIG", "I18NPATH",
)  # fmt: skip
# what the C library also reads and loads nothing by: set afresh for the agent (`env -i`:
# PATH, LANG) or kept for its children by their allow-list (TZ), or formats and lookup
# defaults (tests/test_trust_census_variables.py derives both lists from the loader)
INERT_VARIABLES = ("PATH", "LANG", "TZ", "IFS", "POSIXLY_CORRECT", "MSGVERB", "SEV_LEVEL",
                   "NIS_DEFAULTS", "NIS_GROUP", "HES_DOMAIN")  # fmt: skip


def parse_export(text: str) -> dict[str, str]:
    """Variables from a shell's `export -p`: dash's `export NAME='value'`, bash's
    `declare -x NAME="value"`, zsh's and ksh's `export NAME=value`; a name without a value
    is left out."""
    try:
        words = shlex.split(text, posix=True)
    except ValueError:
        return {}
    out: dict[str, str] = {}
    for word in words:
        if word in ("export", "declare", "typeset") or word.startswith("-"):
            continue
        name, sep, value = word.partition("=")
        if sep and name.isidentifier():
            out[name] = value.replace("\\$", "$").replace("\\`", "`")
    return out


def login_environment() -> tuple[dict[str, str], list[str]]:
    """The login's variables (its `export -p` where the remote command handed it over, else
    this process's own, as under `connection: local` tests), and the loader variables the
    login shell unset before anything ran."""
    text = os.environ.get(LOGIN_ENV)
    if text is None:
        return {k: v for k, v in os.environ.items() if k not in HANDOVER}, []
    source = {k: v for k, v in parse_export(text).items() if k not in HANDOVER}
    # what the agent set for its children itself (the simulated GPUs' state, ...)
    source.update({k: v for k, v in os.environ.items() if k not in (*HANDOVER, *CLEAN)})
    return source, os.environ.get(LOGIN_UNSET, "").split()
