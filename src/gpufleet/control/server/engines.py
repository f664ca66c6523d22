"""What gpufleet knows of each inference engine, one adapter each (issue 38): how its server
is started, how its version and flags are asked of it on the host, the API dialect a bench
speaks to it by default, how many requests it serves at once, whether a profile makes it
draft, how `inv tune` sets its draft depth, and whether it needs a GPU.

The host agent stays engine-neutral: the launch spec carries the probes (`version_argv`,
`help_argv`, `flags_from`), the engine's flag renames across releases, and the facts
(`slots`, `needs_gpu`, `takes_config`) an adapter filled in.
To add an engine: one Engine in ENGINES (and its name in profiles.Profile.engine).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TypedDict

from gpufleet import __version__, engine_facts
from gpufleet.control.server import llamacpp
from gpufleet.control.server.flagvalues import (
    EVERY_GPU,
    Flags,
    GpuClaim,
    flag_int,
    positive,
)
from gpufleet.records import RenameSpec


@dataclass(frozen=True)
class Rename:
    """A flag an engine renamed: where the host's --help no longer takes `old` (unknown,
    ambiguous or deprecated) and takes `new[0]`, preflight rewrites it (host/flagrenames)."""

    old: str
    new: tuple[str, ...]  # the words that replace the old flag (a value it took follows)
    takes_value: bool
    why: str


ADAPTIVE = engine_facts.named(engine_facts.ADAPTIVE_ALGORITHMS)  # "EAGLE or EAGLE3", said

# SGLang's, checked against the real --help of the releases in tests/fixtures/sglang-help/
SGLANG_RENAMES = (
    Rename("--cuda-graph-max-bs", ("--cuda-graph-max-bs-decode",), True,
           "split into -decode and -prefill (deprecated alias from 0.5.14, ambiguous later)"),
    Rename("--enable-flashinfer-allreduce-fusion",
           ("--flashinfer-allreduce-fusion-backend", "auto"), False,
           "deprecated in 0.5.23: use --flashinfer-allreduce-fusion-backend=auto"),
)  # fmt: skip


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
    {host} {port} {tp} {python}); None for the Python-module engines (sglang, sim), which
    run `python -m module` and give their version as a distribution's or gpufleet's own."""

    name: str
    backend: str  # the dialect a bench speaks when --backend is not given
    command: tuple[str, ...] | None = None
    module: str | None = None  # a Python-module engine's server module
    dist: str | None = None  # the distribution whose version is the engine's
    renames: tuple[Rename, ...] = ()
    takes_config: bool = False  # `--config FILE.yaml` (SGLang 0.5.16+, where --help lists it)
    version_args: tuple[str, ...] | None = None  # program + these: its version on a line
    checks_flags: bool = True  # `program --help` lists every flag it takes
    needs_gpu: bool = True
    # a CPU engine whose flags can put work on a GPU (llama.cpp's --n-gpu-layers): then the
    # profile's GPUs are checked before launch and verified 0 MiB after stop, as any GPU
    # engine's
    gpu_when: Callable[[Flags], bool] = lambda flags: False
    # which GPUs its flags put work on, as the server's CUDA counts them: a list, EVERY_GPU
    # (all it sees), or None: the first tp (SGLang's and vLLM's ranks, one per GPU)
    gpu_claim: Callable[[Flags], GpuClaim] = lambda flags: None
    flushes_cache: bool = True  # answers SGLang's /flush_cache (else: prompts are salted)
    slots: Callable[[Flags], int | None] = lambda flags: None  # requests served at once
    slots_flag: str = ""  # the flag that sets them, for the warning's words
    drafts: Callable[[Flags], str | None] = lambda flags: None  # what it drafts with
    drafting: Drafting | None = None  # None: inv tune cannot set its draft depth
    # its processes, for gpu-clean and status (a regex on the command line or title)
    processes: str = ""
    # its /metrics gauges under the names results keep (SGLang's: prom_num_running_reqs_max)
    gauges: tuple[tuple[str, str], ...] = ()
    # why the server would not run these flags as written (refused before any host), and
    # what it would do with them silently (said at launch and sweep)
    refuses: Callable[[Flags], str | None] = lambda flags: None
    warns: Callable[[Flags], list[str]] = lambda flags: []
    # the flags naming more model files than model_path (a draft, a tokenizer), and the one
    # that makes the server run the model's own Python: the launch judges them (issue 50)
    model_flags: tuple[str, ...] = ()
    remote_code_flag: str = ""

    def uses_gpu(self, flags: Flags) -> bool:
        """Whether a server with these flags holds GPU memory (a CPU engine's may)."""
        return self.needs_gpu or self.gpu_when(flags)


def _sglang_drafts(flags: Flags) -> str | None:
    value = flags.get("speculative-algorithm")
    return str(value) if value else None


def _sglang_slots(flags: Flags) -> int | None:
    explicit = flag_int(flags, "max-running-requests")
    if explicit is not None:
        return explicit
    return engine_facts.default_max_running(_sglang_drafts(flags))


def _sglang_warns(flags: Flags) -> list[str]:
    algorithm = _sglang_drafts(flags)
    cap = engine_facts.default_max_running(algorithm)
    if cap is not None and flag_int(flags, "max-running-requests") is None:
        return [f"{algorithm} without max-running-requests: SGLang silently caps it at "
                f"{cap}, so load above C={cap} queues (set it explicitly)"]  # fmt: skip
    return []


# SGLang's other reasons to fall back to static speculation (adaptive_unsupported_reason)
ADAPTIVE_UNSUPPORTED = {
    "enable-multi-layer-eagle": "its worker does not implement adaptive",
    "enable-two-batch-overlap": "the adaptive state swap would drop the TBO backend",
    "enable-pdmux": "the adaptive state swap does not update the decode backend group",
}


def _sglang_refuses(flags: Flags) -> str | None:
    """Why SGLang would silently run this adaptive profile with static speculation, every
    reason it checks (speculative/adaptive_spec_params.py: adaptive_unsupported_reason,
    where it logs "speculative_adaptive disabled ... Falling back to static"), or None."""
    if not flags.get("speculative-adaptive"):
        return None
    problems = []
    algorithm = _sglang_drafts(flags)
    if algorithm not in engine_facts.ADAPTIVE_ALGORITHMS:
        problems.append(f"needs speculative-algorithm {ADAPTIVE} (got {algorithm})")
    topk = flags.get("speculative-eagle-topk")
    if topk not in (None, 1, "1"):
        problems.append(f"needs speculative-eagle-topk 1 (got {topk})")
    if flags.get("enable-dp-attention"):
        problems.append("does not work with attention DP (enable-dp-attention)")
    for flag, why in ADAPTIVE_UNSUPPORTED.items():
        if flags.get(flag):
            problems.append(f"does not work with {flag} ({why})")
    if not problems:
        return None
    return f"speculative-adaptive {'; '.join(problems)}; SGLang would fall back to static"


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


def _sglang_untunable(flags: Flags) -> str | None:
    algorithm = _sglang_drafts(flags)
    if algorithm not in engine_facts.ADAPTIVE_ALGORITHMS:
        return (f"inv tune needs speculative-algorithm {ADAPTIVE} (got {algorithm}); "
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
    refuse=_sglang_untunable,
)


def _vllm_drafts(flags: Flags) -> str | None:
    config = flags.get("speculative-config")
    return str(config)[:40] if config else None


LLAMACPP_DRAFTING = Drafting(
    flags=llamacpp.draft_flags,
    depth=llamacpp.depth,
    static_remove=("spec-draft-n-min", "draft-min"),  # a minimum above d would refuse it
    adaptive=False,
    refuse=llamacpp.refuses,
)


SGLANG = Engine(
    "sglang", "sglang", module="sglang.launch_server", dist="sglang", renames=SGLANG_RENAMES,
    takes_config=True, slots=_sglang_slots, slots_flag="max-running-requests",
    drafts=_sglang_drafts, drafting=SGLANG_DRAFTING, refuses=_sglang_refuses,
    warns=_sglang_warns,
    # upstream SGLang's own cleanup pattern (docs/FACTS.md, "SGLang's HTTP server")
    processes=r"sglang::|sglang\.launch_server|sglang\.bench|sglang\.data_parallel|sglang\.srt",
    model_flags=("speculative-draft-model-path", "tokenizer-path"),
    remote_code_flag="trust-remote-code",
)  # fmt: skip

ENGINES: dict[str, Engine] = {
    e.name: e
    for e in (
        SGLANG,
        # the rehearsal engine takes SGLang's flags (and their renames) as SGLang does; its
        # version is this gpufleet's, and it too must not survive gpu-clean
        replace(SGLANG, name="sim", module="gpufleet.sim.server", dist=None,
                processes=r"gpufleet\.sim\.server"),
        # llama.cpp's server (REFERENCE.md): --parallel N slots (its default, -1, is
        # "auto": unknown here), drafts only with --spec-type, no GPU needed
        Engine("llamacpp", "openai",
               command=("llama-server", "-m", "{model_path}", "--host", "{host}",
                        "--port", "{port}"),
               version_args=("--version",), needs_gpu=False, flushes_cache=False,
               gpu_when=lambda flags: (flag_int(flags, "n-gpu-layers", "ngl", "gpu-layers")
                                       or 0) != 0,
               gpu_claim=llamacpp.gpus,
               slots=lambda flags: positive(flag_int(flags, "parallel", "np")),
               slots_flag="parallel", drafts=llamacpp.drafts, drafting=LLAMACPP_DRAFTING,
               processes=r"(^|/)llama-server$", model_flags=("model-draft", "md"),
               gauges=(("llamacpp:requests_processing", "sglang:num_running_reqs"),
                       ("llamacpp:requests_deferred", "sglang:num_queue_reqs"),
                       ("llamacpp:predicted_tokens_seconds", "sglang:gen_throughput"),
                       ("llamacpp:kv_cache_usage_ratio", "sglang:token_usage"))),
        Engine("vllm", "openai",
               command=("vllm", "serve", "{model_path}", "--host", "{host}", "--port",
                        "{port}", "--tensor-parallel-size", "{tp}"),
               version_args=("--version",), flushes_cache=False,
               slots=lambda flags: flag_int(flags, "max-num-seqs"),
               slots_flag="max-num-seqs", drafts=_vllm_drafts, model_flags=("tokenizer",),
               remote_code_flag="trust-remote-code",
               # v1 renamed the KV-cache gauge; both are read
               gauges=(("vllm:num_requests_running", "sglang:num_running_reqs"),
                       ("vllm:num_requests_waiting", "sglang:num_queue_reqs"),
                       ("vllm:gpu_cache_usage_perc", "sglang:token_usage"),
                       ("vllm:kv_cache_usage_perc", "sglang:token_usage"))),
        Engine("custom", "sglang", checks_flags=False, needs_gpu=True),
    )
}  # fmt: skip
NAMES = tuple(ENGINES)


def server_gpus(name: str, flags: Flags, tp: int) -> tuple[list[int], bool]:
    """The GPUs a server of this engine holds, as its CUDA counts them, and whether it
    holds every one it sees (then the host, which can count them, lists them)."""
    adapter = ENGINES[name]
    if not adapter.uses_gpu(flags):
        return [], False  # a CPU engine holds no GPU: nothing to check before, nor after
    claim = adapter.gpu_claim(flags)
    if claim == EVERY_GPU:
        return [], True
    return (list(range(tp)) if claim is None else list(claim)), False


def engine(name: str) -> Engine:
    """The adapter of an engine by name."""
    return ENGINES[name]


REMOTE_CODE = "--trust-remote-code"


def _json_models(value: object) -> list[object]:
    """The model and tokenizer names inside a JSON object a flag carries (vLLM's
    `--speculative-config '{"model": "/models/draft", ...}'`: issue 68.3)."""
    if not isinstance(value, str) or not value.lstrip().startswith("{"):
        return []
    try:
        data = json.loads(value)
    except ValueError:
        return []
    if not isinstance(data, dict):
        return []
    return [v for k, v in data.items() if "model" in k.lower() or "tokenizer" in k.lower()]


def _says_remote_code(argv: list[str]) -> bool:
    """Whether a command line (a custom engine's own) trusts remote code."""
    for word in argv:
        name, eq, value = word.partition("=")
        if name == REMOTE_CODE and (not eq or value.lower() not in ("false", "0", "no")):
            return True
    return False


@dataclass(frozen=True)
class ModelFiles:
    """What a server of an engine loads and runs of its model, as far as gpufleet can see."""

    paths: list[str]  # local paths (a hub id is no path)
    runs_code: bool  # the model's own Python runs (remote code trusted)
    known: bool  # every path it loads is among `paths` (a custom command's are not known)


def model_files(name: str, model_path: str, flags: Flags, argv: list[str]) -> ModelFiles:
    """The local paths a server of this engine loads its model from: model_path, a draft's
    or tokenizer's given by flag, or inside a flag's JSON; and whether it runs the model's
    own Python, by its flag or anywhere in its command line."""
    adapter = ENGINES[name]
    named = [model_path, *(flags.get(flag) for flag in adapter.model_flags)]
    for value in flags.values():
        named += _json_models(value)
    paths = [str(p) for p in named if isinstance(p, str) and p.startswith("/")]
    runs_code = bool(adapter.remote_code_flag and flags.get(adapter.remote_code_flag))
    return ModelFiles(paths, runs_code or _says_remote_code(argv), name != "custom")


def gauge_names(name: str | None) -> dict[str, str]:
    """The engine's /metrics gauges under the names results keep; every engine's where the
    engine is not known here (a bench by hand: each engine's names carry its own prefix)."""
    chosen = [ENGINES[name]] if name in ENGINES else list(ENGINES.values())
    return {theirs: ours for e in chosen for theirs, ours in e.gauges}


def process_patterns() -> list[str]:
    """What gpu-clean and status look for besides NVML's PIDs: every engine's processes."""
    return ["|".join(e.processes for e in ENGINES.values() if e.processes)]


@dataclass(frozen=True)
class Probes:
    """What the host asks the engine before a launch, filled into the launch spec."""

    version_argv: list[str]
    help_argv: list[str]
    flags_from: int
    version: str | None = None  # known without asking (the rehearsal engine is this gpufleet)
    version_missing: str = ""  # said where the version probe prints nothing
    renames: tuple[RenameSpec, ...] = ()
    takes_config: bool = False


class ProbeSettings(TypedDict):
    """What a profile says of its engine's probes (custom engines): its version command
    and whether its --help lists its flags (None: the engine's default)."""

    version_command: list[str] | None
    check_flags: bool | None


# the distribution's version; where it is not found, the folders on the path this user
# may not read are said (exit 3): "not installed" must not hide "permission denied"
DIST_VERSION = (
    "import os, sys\nfrom importlib import metadata\n"
    "try:\n    print(metadata.version({!r}))\n"
    "except metadata.PackageNotFoundError:\n"
    "    def shut(p):\n"
    "        try:\n            os.listdir(p)\n        except PermissionError:\n"
    "            return True\n        except OSError:\n            return False\n"
    "        return False\n"
    "    closed = [p for p in sys.path if p and shut(p)]\n"
    "    if closed:\n"
    "        print('permission denied: ' + ', '.join(closed), file=sys.stderr)\n"
    "        sys.exit(3)\n"
    "    raise\n"
)


def probes(name: str, argv: list[str], settings: ProbeSettings) -> Probes:
    """The engine's version and --help probes, run by the agent in the server's environment
    (`settings`: the profile's `version_command` and `check_flags`, for custom engines).
    A module engine is asked with its own Python (`python -m module --help`, its
    distribution's version); a program's --help is asked of the argv's words before its
    first flag (`llama-server`, `vllm serve MODEL`)."""
    adapter = ENGINES[name]
    renames = tuple(RenameSpec(old=r.old, new=list(r.new), takes_value=r.takes_value, why=r.why)
                    for r in adapter.renames)  # fmt: skip
    if adapter.module is not None:
        python = argv[0]
        if adapter.dist is None:
            return Probes([], argv[:3], 3, f"gpufleet-{name} {__version__}", "", renames,
                          adapter.takes_config)  # fmt: skip
        missing = f"has no {adapter.dist} installed (pip show {adapter.dist} found nothing)"
        return Probes([python, "-c", DIST_VERSION.format(adapter.dist)], argv[:3], 3, None,
                      missing, renames, adapter.takes_config)  # fmt: skip
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
    return Probes(version_argv, argv[:head] if checks and head else [], head, None, "",
                  renames, adapter.takes_config)  # fmt: skip
