"""SGLang's launch flags (0.5.x names) plus clearly separate `--sim-*` knobs.

Unknown flags fail exactly like argparse does in `python -m sglang.launch_server`.
"""

from __future__ import annotations

import argparse
import json
import sys

from gpufleet.sim.speculation import parse_accept_rates

SPECULATIVE_ALGORITHMS = ["EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m gpufleet.sim.server",
        description="gpufleet rehearsal engine: an SGLang-compatible simulated server",
        allow_abbrev=True,  # SGLang relies on argparse prefixes (`--tp` for `--tp-size`)
    )
    a = p.add_argument
    a("--model-path", required=True)
    a("--tokenizer-path")
    a("--served-model-name")
    a("--tp-size", type=int, default=1)
    a("--dp-size", type=int, default=1)
    a("--host", default="127.0.0.1")
    a("--port", type=int, default=30000)
    a("--trust-remote-code", action="store_true")
    a("--cuda-graph-bs", type=int, nargs="+")  # the captured decode batch sizes
    a("--cuda-graph-max-bs", type=int)
    a("--cuda-graph-max-bs-decode", type=int)  # 0.5.14+ names
    a("--cuda-graph-max-bs-prefill", type=int)
    a("--flashinfer-allreduce-fusion-backend")
    a("--disable-cuda-graph", action="store_true")
    a("--disable-custom-all-reduce", action="store_true")
    a("--attention-backend")
    a("--enable-flashinfer-allreduce-fusion", action="store_true")
    a("--mem-fraction-static", type=float, default=0.88)
    a("--max-running-requests", type=int)
    a("--chunked-prefill-size", type=int)
    a("--context-length", type=int)
    a("--enable-metrics", action="store_true")
    a("--nnodes", type=int, default=1)
    a("--node-rank", type=int, default=0)
    a("--dist-init-addr")
    a("--skip-server-warmup", action="store_true")
    a("--watchdog-timeout", type=float, default=300)
    a("--base-gpu-id", type=int, default=0)
    a("--log-level", default="info")
    a("--api-key")  # checked on requests as SGLang does (sim/auth.py)
    a("--admin-api-key")
    a("--config", help="read options from a YAML file (SGLang 0.5.16+); the command line wins")
    a("--speculative-algorithm", choices=SPECULATIVE_ALGORITHMS)
    a("--speculative-draft-model-path")
    a("--speculative-num-steps", type=int)
    a("--speculative-eagle-topk", type=int)
    a("--speculative-num-draft-tokens", type=int)
    a("--speculative-adaptive", action="store_true")
    a("--speculative-adaptive-config")
    a("--enable-dp-attention", action="store_true")
    a("--enable-multi-layer-eagle", action="store_true")
    a("--enable-two-batch-overlap", action="store_true")
    a("--enable-pdmux", action="store_true")
    a("--disable-radix-cache", action="store_true")
    a("--enable-cache-report", action="store_true")

    s = p.add_argument_group("simulation (gpufleet only)")
    s.add_argument(
        "--sim-load-seconds",
        type=float,
        default=3.0,
        help="port closed while 'loading weights' (default 3)",
    )
    s.add_argument(
        "--sim-warmup-seconds",
        type=float,
        default=0.5,
        help="/health answers 503 this long after the port opens",
    )
    s.add_argument("--sim-decode-base-ms", type=float, help="decode step cost at batch 1")
    s.add_argument(
        "--sim-decode-per-req-ms", type=float, help="extra step cost per running request"
    )
    s.add_argument("--sim-prefill-per-token-us", type=float, default=20.0)
    s.add_argument(
        "--sim-accept-length",
        type=float,
        help="mean tokens per request per step with speculation (default 2.4)",
    )
    s.add_argument(
        "--sim-accept-rate",
        help="chance each drafted token is accepted: one rate (0.7) or by what the prompt "
        "asks (chat=0.56,code=0.65, the defaults; sim/speculation.py has the sources)",
    )
    s.add_argument(
        "--sim-draft-cost",
        type=float,
        default=1.0,
        help="the draft model's cost, times the calibrated one (default 1)",
    )
    s.add_argument(
        "--sim-zero-cost",
        action="store_true",
        help="every step costs nothing: measures the server's own ceiling",
    )
    s.add_argument(
        "--sim-crash-at-batch",
        type=int,
        help="crash (the seeds' tensor-size error) when the batch first exceeds N",
    )
    s.add_argument(
        "--sim-crash-during-load",
        action="store_true",
        help="fail while loading: 'Initialization failed. warmup error'",
    )
    s.add_argument(
        "--sim-cache-tokens",
        type=int,
        default=400_000,
        help="prefix (radix) cache capacity in tokens (default 400000; 0: no cache)",
    )
    s.add_argument("--sim-seed", type=int, default=0)
    s.add_argument(
        "--sim-trace-keep",
        type=int,
        default=4096,
        help="requests whose token emission times /sim/trace keeps",
    )
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
    if args.sim_draft_cost < 0:
        raise SystemExit(f"error: --sim-draft-cost {args.sim_draft_cost}: must be >= 0")
    return args
