"""What gpufleet knows of each inference engine, one adapter each (issue 38): how its server
is started, how its version and flags are asked of it on the host, the API dialect a bench
speaks to it by default, how many requests it serves at once, whether a profile makes it
draft, how `inv tune` sets its draft depth, and whether it needs a GPU.

The host agent stays engine-neutral: the launch spec carries the probes (`version_argv`,
`help_argv`, `flags_from`) and the facts (`slots`, `needs_gpu`) an adapter filled in.
To add an engine: one Engine in ENGINES (and its name in playbook.Profile.engine).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gpufleet.wire import JsonObject

Flags = dict[str, object]


def _flag_int(flags: Flags, *names: str) -> int | None:
    for name in names:
        value = flags.get(name)
        if value not in (None, False, True):
            try:
                return int(str(value))
            except ValueError:
                return None
    return None


def _positive(value: int | None) -> int | None:
    return value if value is not None and value > 0 else None


@dataclass(frozen=True)
class Drafting:
    """How `inv tune` sets an engine's draft depth. `adaptive`: the server switches depth by
    batch size from a table (SGLang's --speculative-adaptive-config), so the tune writes
    that table; else one static depth serves every load, and the tune chooses it."""

    flags: Callable[[Flags], list[str]]  # the profile's flags that make it draft
    depth: Callable[[Flags, int], Flags]  # the flags that pin static depth d >= 1
    static_remove: tuple[str, ...]  # dropped from every static-depth cell
    adaptive: bool
    refuse: Callable[[Flags], str | None]  # why this profile cannot be tuned, or None


@dataclass(frozen=True)
class Engine:
    """One engine's facts. `command` is the argv template of a program engine ({model_path}
    {host} {port} {tp} {python}); None for the Python-module engines (sglang, sim)."""

    name: str
    backend: str  # the dialect a bench speaks when --backend is not given
    command: tuple[str, ...] | None = None
    version_args: tuple[str, ...] | None = None  # program + these: its version on a line
    checks_flags: bool = True  # `program --help` lists every flag it takes
    needs_gpu: bool = True
    flushes_cache: bool = True  # answers SGLang's /flush_cache (else: prompts are salted)
    slots: Callable[[Flags], int | None] = lambda flags: None  # requests served at once
    slots_flag: str = ""  # the flag that sets them, for the warning's words
    drafts: Callable[[Flags], str | None] = lambda flags: None  # what it drafts with
    drafting: Drafting | None = None  # None: inv tune cannot set its draft depth


def _sglang_drafts(flags: Flags) -> str | None:
    value = flags.get("speculative-algorithm")
    return str(value) if value else None


def _sglang_slots(flags: Flags) -> int | None:
    explicit = _flag_int(flags, "max-running-requests")
    if explicit is not None:
        return explicit
    # SGLang caps EAGLE, EAGLE3 and STANDALONE at 48 when it is not set (REFERENCE.md)
    return 48 if _sglang_drafts(flags) in ("EAGLE", "EAGLE3", "STANDALONE") else None


# SGLang's speculative flags: all of them go for the tune's plain server
SGLANG_SPEC_FLAGS = (
    "speculative-algorithm",
    "speculative-draft-model-path",
    "speculative-num-steps",
    "speculative-eagle-topk",
    "speculative-num-draft-tokens",
    "speculative-adaptive",
    "speculative-adaptive-config",
)


def _sglang_refuses(flags: Flags) -> str | None:
    algorithm = _sglang_drafts(flags)
    if algorithm not in ("EAGLE", "EAGLE3"):
        return (f"inv tune needs speculative-algorithm EAGLE or EAGLE3 (got {algorithm}); "
                "adaptive speculation supports only those")  # fmt: skip
    if flags.get("enable-dp-attention"):
        return "adaptive speculation does not support DP attention"
    return None


SGLANG_DRAFTING = Drafting(
    flags=lambda flags: list(SGLANG_SPEC_FLAGS),
    depth=lambda flags, d: {
        "speculative-num-steps": d,
        "speculative-eagle-topk": 1,
        "speculative-num-draft-tokens": d + 1,
    },
    static_remove=("speculative-adaptive", "speculative-adaptive-config"),
    adaptive=True,
    refuse=_sglang_refuses,
)


def _llamacpp_draft_flags(flags: Flags) -> list[str]:
    return [k for k in flags if "draft" in k or k in ("md", "spec-type")]


def _llamacpp_depth(flags: Flags, depth: int) -> Flags:
    # this llama.cpp's --spec-draft-n-max; older builds call it --draft-max (REFERENCE.md)
    name = "draft-max" if "draft-max" in flags else "spec-draft-n-max"
    return {name: depth}


def _llamacpp_refuses(flags: Flags) -> str | None:
    drafts = _llamacpp_drafts(flags)
    if drafts is None:
        return "inv tune needs a draft model (model-draft) to set the depth of"
    if "unused" in drafts:
        return "its draft is unused without spec-type (e.g. draft-simple): nothing to tune"
    return None


LLAMACPP_DRAFTING = Drafting(
    flags=_llamacpp_draft_flags,
    depth=_llamacpp_depth,
    static_remove=("spec-draft-n-min", "draft-min"),  # a minimum above d would refuse it
    adaptive=False,
    refuse=_llamacpp_refuses,
)


def _llamacpp_drafts(flags: Flags) -> str | None:
    draft = flags.get("model-draft") or flags.get("md")
    if not draft:
        return None
    kind = flags.get("spec-type")
    return f"draft model ({kind})" if kind else "draft model (no --spec-type: unused)"


def _vllm_drafts(flags: Flags) -> str | None:
    config = flags.get("speculative-config")
    return str(config)[:40] if config else None


ENGINES: dict[str, Engine] = {
    e.name: e
    for e in (
        Engine("sglang", "sglang", slots=_sglang_slots, slots_flag="max-running-requests",
               drafts=_sglang_drafts, drafting=SGLANG_DRAFTING),
        Engine("sim", "sglang", needs_gpu=True, slots=_sglang_slots,
               slots_flag="max-running-requests", drafts=_sglang_drafts,
               drafting=SGLANG_DRAFTING),
        # llama.cpp's server (REFERENCE.md): --parallel N slots (its default, -1, is
        # "auto": unknown here), drafts only with --spec-type, no GPU needed
        Engine("llamacpp", "openai",
               command=("llama-server", "-m", "{model_path}", "--host", "{host}",
                        "--port", "{port}"),
               version_args=("--version",), needs_gpu=False, flushes_cache=False,
               slots=lambda flags: _positive(_flag_int(flags, "parallel", "np")),
               slots_flag="parallel", drafts=_llamacpp_drafts, drafting=LLAMACPP_DRAFTING),
        Engine("vllm", "openai",
               command=("vllm", "serve", "{model_path}", "--host", "{host}", "--port",
                        "{port}", "--tensor-parallel-size", "{tp}"),
               version_args=("--version",), flushes_cache=False,
               slots=lambda flags: _flag_int(flags, "max-num-seqs"),
               slots_flag="max-num-seqs", drafts=_vllm_drafts),
        Engine("custom", "sglang", checks_flags=False, needs_gpu=True),
    )
}  # fmt: skip
NAMES = tuple(ENGINES)


def engine(name: str) -> Engine:
    return ENGINES[name]


@dataclass(frozen=True)
class Probes:
    """What the host asks the engine before a launch, filled into the launch spec."""

    version_argv: list[str]
    help_argv: list[str]
    flags_from: int


def probes(name: str, argv: list[str], settings: JsonObject) -> Probes:
    """A program engine's version and --help probes (`settings`: the profile's
    `version_command` and `check_flags`, for custom engines); the module engines
    (sglang, sim) are asked by the agent itself (host/preflight.py). --help is asked of
    the argv's words before its first flag (`llama-server`, `vllm serve MODEL`)."""
    adapter = ENGINES[name]
    if adapter.command is None and name != "custom":
        return Probes([], [], 0)
    head = next((i for i, word in enumerate(argv) if word.startswith("-")), len(argv))
    version = settings.get("version_command")
    if isinstance(version, list) and version:
        version_argv = [str(w) for w in version]
    elif adapter.version_args and argv:
        version_argv = [argv[0], *adapter.version_args]
    else:
        version_argv = []
    check = settings.get("check_flags")
    checks = adapter.checks_flags if check is None else bool(check)
    return Probes(version_argv, argv[:head] if checks and head else [], head)
