"""SGLang's launch flags (0.5.x names) plus clearly separate `--sim-*` knobs.

Unknown flags fail exactly like argparse does in `python -m sglang.launch_server`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import TypedDict

from gpufleet.sim.speculation import parse_accept_rates

SPECULATIVE_ALGORITHMS = ["EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM"]


class ArgKeywords(TypedDict, total=False):
    """argparse's add_argument keywords, the ones these tables use."""

    type: Callable[[str], object]
    default: object
    action: str
    required: bool
    nargs: str
    choices: list[str]
    help: str


# SGLang's flags the rehearsal accepts, as data: (flag, argparse keywords)
_STORE: ArgKeywords = {"action": "store_true"}
_INT: ArgKeywords = {"type": int}
_FLOAT: ArgKeywords = {"type": float}
SGLANG_FLAGS: list[tuple[str, ArgKeywords]] = [
    ("--model-path", {"required": True}),
    ("--tokenizer-path", {}),
    ("--served-model-name", {}),
    ("--tp-size", {"type": int, "default": 1}),
    ("--dp-size", {"type": int, "default": 1}),
    ("--host", {"default": "127.0.0.1"}),
    ("--port", {"type": int, "default": 30000}),
    ("--trust-remote-code", _STORE),
    ("--cuda-graph-bs", {"type": int, "nargs": "+"}),  # the captured decode batch sizes
    ("--cuda-graph-max-bs", _INT),
    ("--cuda-graph-max-bs-decode", _INT),  # 0.5.14+ names
    ("--cuda-graph-max-bs-prefill", _INT),
    ("--flashinfer-allreduce-fusion-backend", {}),
    ("--disable-cuda-graph", _STORE),
    ("--disable-custom-all-reduce", _STORE),
    ("--attention-backend", {}),
    ("--enable-flashinfer-allreduce-fusion", _STORE),
    ("--mem-fraction-static", {"type": float, "default": 0.88}),
    ("--max-running-requests", _INT),
    ("--chunked-prefill-size", _INT),
    ("--context-length", _INT),
    ("--enable-metrics", _STORE),
    ("--nnodes", {"type": int, "default": 1}),
    ("--node-rank", {"type": int, "default": 0}),
    ("--dist-init-addr", {}),
    ("--skip-server-warmup", _STORE),
    ("--watchdog-timeout", {"type": float, "default": 300}),
    ("--base-gpu-id", {"type": int, "default": 0}),
    ("--log-level", {"default": "info"}),
    ("--api-key", {}),  # checked on requests as SGLang does (sim/auth.py)
    ("--admin-api-key", {}),
    ("--config", {"help": "read options from a YAML file (SGLang 0.5.16+); the command line wins"}),
    ("--speculative-algorithm", {"choices": SPECULATIVE_ALGORITHMS}),
    ("--speculative-draft-model-path", {}),
    ("--speculative-num-steps", _INT),
    ("--speculative-eagle-topk", _INT),
    ("--speculative-num-draft-tokens", _INT),
    ("--speculative-adaptive", _STORE),
    ("--speculative-adaptive-config", {}),
    ("--enable-dp-attention", _STORE),
    ("--enable-multi-layer-eagle", _STORE),
    ("--enable-two-batch-overlap", _STORE),
    ("--enable-pdmux", _STORE),
    ("--disable-radix-cache", _STORE),
    ("--enable-cache-report", _STORE),
]

# the rehearsal's own knobs, apart from SGLang's
SIM_FLAGS: list[tuple[str, ArgKeywords]] = [
    ("--sim-load-seconds", {"type": float, "default": 3.0,
                            "help": "port closed while 'loading weights' (default 3)"}),
    ("--sim-warmup-seconds", {"type": float, "default": 0.5,
                              "help": "/health answers 503 this long after the port opens"}),
    ("--sim-decode-base-ms", {"type": float, "help": "decode step cost at batch 1"}),
    ("--sim-decode-per-req-ms", {"type": float, "help": "extra step cost per running request"}),
    ("--sim-prefill-per-token-us", {"type": float, "default": 20.0}),
    ("--sim-accept-length", {
        "type": float, "help": "mean tokens per request per step with speculation (default 2.4)",
    }),
    ("--sim-accept-rate", {
        "help": "chance each drafted token is accepted: one rate (0.7) or by what the prompt "
                "asks (chat=0.56,code=0.65, the defaults; sim/speculation.py has the sources)",
    }),
    ("--sim-draft-cost", {"type": float, "default": 1.0,
                          "help": "the draft model's cost, times the calibrated one (default 1)"}),
    ("--sim-draft-base-cost", {"type": float,
                               "help": "its fixed part per draft step alone, times the "
                                       "calibrated one (default: --sim-draft-cost)"}),
    ("--sim-zero-cost", {"action": "store_true",
                         "help": "every step costs nothing: measures the server's own ceiling"}),
    ("--sim-crash-at-batch", {
        "type": int, "help": "crash (the seeds' tensor-size error) when the batch first exceeds N",
    }),
    ("--sim-crash-during-load", {
        "action": "store_true", "help": "fail while loading: 'Initialization failed. warmup error'",
    }),
    ("--sim-cache-tokens", {
        "type": int, "default": 400_000,
        "help": "prefix (radix) cache capacity in tokens (default 400000; 0: no cache)",
    }),
    ("--sim-hold-while", {
        "help": "no request gets a token while this file exists: a test holds a level open "
                "at a state it can interrupt, then removes the file to let it finish",
    }),
    ("--sim-seed", {"type": int, "default": 0}),
    ("--sim-trace-keep", {"type": int, "default": 4096,
                          "help": "requests whose token emission times /sim/trace keeps"}),
]  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    """SGLang's launch flags (above) and the rehearsal's own, in their own group."""
    p = argparse.ArgumentParser(
        prog="python -m gpufleet.sim.server",
        description="gpufleet rehearsal engine: an SGLang-compatible simulated server",
        allow_abbrev=True,  # SGLang relies on argparse prefixes (`--tp` for `--tp-size`)
    )
    for flag, keywords in SGLANG_FLAGS:
        p.add_argument(flag, **keywords)
    group = p.add_argument_group("simulation (gpufleet only)")
    for flag, keywords in SIM_FLAGS:
        group.add_argument(flag, **keywords)
    return p


def config_argv(path: str) -> list[str]:
    """The options of a `--config` file as argv, as SGLang's ConfigArgumentMerger makes them:
    `name: value` pairs, true booleans as bare flags, false ones left out. JSON (which YAML
    includes) or flat `key: value` lines: the rehearsal needs no YAML library."""
    if not path.endswith((".yaml", ".yml")):
        raise SystemExit(f"error: config file must be YAML (.yaml or .yml): {path}")
    with open(path) as fh:
        text = fh.read()
    try:
        data = json.loads(text)
    except ValueError:
        data = {}
        for line in text.splitlines():
            key, sep, value = line.partition(":")
            if sep and not line.lstrip().startswith("#"):
                data[key.strip()] = value.strip().strip("'\"")
    out: list[str] = []
    for key, value in data.items():
        flag = "--" + str(key).replace("_", "-")
        if value is True or value in ("true", "True"):
            out.append(flag)
        elif value not in (False, None, "false", "False"):
            out += [flag, str(value)]
    return out


def _with_config(argv: list[str]) -> list[str]:
    for i, word in enumerate(argv):
        path = word.split("=", 1)[1] if word.startswith("--config=") else None
        if word == "--config" and i + 1 < len(argv):
            path = argv[i + 1]
        if path is not None:
            return config_argv(path) + argv  # later (command-line) values win
    return argv


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(_with_config(argv))
    args.explicit_max_running = args.max_running_requests is not None
    try:
        parse_accept_rates(args.sim_accept_rate)  # a bad rate: one line before the load
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None
    for flag, value in (("--sim-draft-cost", args.sim_draft_cost),
                        ("--sim-draft-base-cost", args.sim_draft_base_cost)):  # fmt: skip
        if value is not None and value < 0:
            raise SystemExit(f"error: {flag} {value}: must be >= 0")
    return args
