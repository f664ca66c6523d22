"""The option groups several tasks share (hosts and inventory, the archive, a benchmark
request, an experiment's), declared once; each task's module declares its own set from
them (the mechanism is cli/options.py). A request's help and defaults are its type's own:
BenchRequest (control/bench/request.py), CleanOptions, LaunchOptions, and the stop and logs
verbs' arguments (host/agent/protocol.py).

Read by `inv --list`: it imports only light modules at import time.
"""

from __future__ import annotations

from gpufleet.archive.layout import DEFAULT_ROOT
from gpufleet.cli import args as checks
from gpufleet.cli.args import (
    archive_root,
    choice,
    client_procs,
    levels,
    nonzero,
    slo_spec,
    workload_spec,
)
from gpufleet.cli.options import Option, OptionSet, Rule, switch
from gpufleet.control.bench.request import BenchRequest
from gpufleet.host.bench.dialects import NAMES as BACKENDS

DAY = 86_400
PORT_MAX = 65_535
count, positive_int, positive_float = (
    checks.non_negative_int,
    checks.positive_int,
    checks.positive_float,
)


def fleet_options(request_type: type | None = None) -> OptionSet:
    return OptionSet(
        request_type,
        hosts=Option(
            "hosts, groups or a comma list from the inventory (default: all); `healthy` or "
            "`healthy:NAMES`: skip those whose last gpu-clean found a bad GPU",
            default=None, short="H",
        ),
        inventory=Option("inventory file or name under hosts/ (default: $GPUFLEET_INVENTORY or "
                         "rehearsal)", default=None, short="i"),
        forks=Option("hosts in parallel", count, default=0, default_text="the inventory's forks, "
                     "32", most=1024, short="f"),
    )  # fmt: skip


def archive_option() -> Option:
    return Option("archive root", archive_root, default=None,
                  default_text=f"{DEFAULT_ROOT}/ or $GPUFLEET_ARCHIVE", short="a")  # fmt: skip


CONCURRENCY_REQUIRED = Rule(
    lambda o: not o.concurrency, "--concurrency is required (e.g. --concurrency 1,10,64)"
)


def engine_backends() -> str:
    """Each engine's default dialect in words, from the adapter registry (engines.py):
    `sglang for sglang and sim, openai for llamacpp and vllm, ...`."""
    from gpufleet.control.server.engines import ENGINES

    by_backend: dict[str, list[str]] = {}
    for name, adapter in ENGINES.items():
        by_backend.setdefault(adapter.backend, []).append(name)
    return ", ".join(f"{b} for {' and '.join(names)}" for b, names in by_backend.items())


def request_options() -> OptionSet:
    """The options of a benchmark request, shared by bench, sweep and tune."""
    return OptionSet(
        BenchRequest,
        backend=Option(default_text=f"the profile's engine's ({engine_backends()})",
                       check=choice(*BACKENDS)),
        concurrency=Option(check=levels, iterable=True, short="c", most=100_000),
        num_prompts=Option(check=nonzero(count), default_text="max(10, 4 x C)", most=100_000),
        duration=Option(check=nonzero(positive_float), most=7 * DAY),
        request_rate=Option(check=nonzero(positive_float), most=1_000_000,
                            expected="a rate in requests per second, such as 4"),
        request_timeout=Option(check=positive_float, most=7 * DAY,
                               expected="seconds, such as 600"),
        output_len=Option(check=positive_int, most=1_000_000),
        prompts=Option(),
        seed=Option(check=count, most=2**32 - 1),
        workload=Option(check=workload_spec),
        trace=Option(),
        trace_speedup=Option(check=positive_float, most=10_000, expected="a factor, such as 2"),
        random_input_len=Option(check=positive_int, most=1_000_000),
        random_output_len=Option(check=positive_int, default_text="--output-len",
                                 most=1_000_000),
        random_vocab=Option(check=positive_int, most=10_000_000,
                            expected="a vocabulary size, such as 512"),
        random_range_ratio=Option(check=positive_float, default_text="1: exact", most=1,
                                  expected="a ratio above 0 and at most 1, such as 0.5"),
        slo=Option(check=slo_spec, default=None),
        flush=Option(field="flush_cache", flag_default=True, default=True, default_text="on"),
        repeat=Option(check=positive_int, most=100),
        client_procs=Option(check=client_procs, most=1024),
        archive=archive_option(),
    )  # fmt: skip


def experiment_options() -> OptionSet:
    """What sweep and tune share: the request's options a cell benches with, and the
    experiment's own (resume, engine override, hosts)."""
    cell = request_options().only(
        "concurrency", "num_prompts", "output_len", "prompts", "seed", "workload", "trace",
        "trace_speedup", "random_input_len", "random_output_len", "random_range_ratio", "slo",
        "flush", "archive", "backend", "random_vocab",
    )  # fmt: skip
    own = OptionSet(
        BenchRequest,
        CONCURRENCY_REQUIRED,
        resume=switch("finish the latest run of this experiment (re-attach, re-run failed cells)"),
        engine=Option("override the server engine (sim to rehearse)", default=None,
                      to_request=False),
        allow_unhealthy=switch("launch even on a GPU the health check calls bad (recorded in "
                               "each run)"),
    )  # fmt: skip
    return cell | own | fleet_options(BenchRequest)
