"""Every task's options, declared once (the mechanism is cli/options.py). A request's
defaults are its type's own: BenchRequest (control/bench/request.py), CleanOptions,
LaunchOptions, and the stop and logs verbs' arguments (host/agent/protocol.py).

This module is read by `inv --list`: it imports only light modules at import time.
"""

from __future__ import annotations

from typing import Any

from gpufleet.archive.layout import DEFAULT_ROOT
from gpufleet.cli import args as checks
from gpufleet.cli.args import Arg
from gpufleet.cli.options import Option, OptionSet, Rule, switch
from gpufleet.control.bench.request import BenchRequest
from gpufleet.control.server.engines import NAMES as ENGINE_NAMES
from gpufleet.control.server.options import CleanOptions, LaunchOptions
from gpufleet.errors import UserError
from gpufleet.host.agent.protocol import LogsArgs, StopArgs
from gpufleet.kinds import BACKENDS
from gpufleet.records import HEALTH_TIMEOUT_S

DAY = 86_400
PORT_MAX = 65_535
TUNE_LADDER = [1, 2, 4, 8, 16, 32, 64]  # tune's default load ladder
FIND_MAX_LIMIT = {"concurrency": 1024, "request-rate": 1000}  # highest load --find-max tries


# --- checks that are more than a number ------------------------------------------------


def _nonzero(check: Any) -> Any:
    """A number where 0 or absent means "not set" (None): --port, --duration."""
    return lambda value, arg: check(value, Arg(arg.flag, 0, arg.most, arg.expected)) or arg.default


def _levels(value: Any, arg: Arg) -> list[int]:
    return checks.int_list(value, arg) or list(arg.default or [])


def _gpu_indexes(value: Any, arg: Arg) -> list[int]:
    return checks.int_list(value, arg, least=0)


def _interval(value: Any, arg: Arg) -> float:
    """Seconds, where 0 turns it off (--telemetry-interval)."""
    if value is not None and str(value).strip() in ("0", "0.0"):
        return 0.0
    return checks.positive_float(value, arg)


def _slo(value: Any, arg: Arg) -> dict[str, float]:
    from gpufleet.host.bench.slo import parse_slo

    try:
        return parse_slo(value)
    except ValueError as exc:
        raise UserError(f"{arg.flag} {value}: {exc}") from None


def _workload(value: Any, arg: Arg) -> str:
    from gpufleet.control.bench.workloads import parse_workload

    parse_workload(value)  # a bad name or option: one line now
    return value or arg.default


def _archive(value: Any, arg: Arg) -> Any:
    """The archive at --archive, else $GPUFLEET_ARCHIVE, else logs/ (Archive.at)."""
    from gpufleet.archive.layout import Archive

    return Archive.at(value)


def _client_procs(value: Any, arg: Arg) -> int | str:
    """N generator processes per level, or `auto` (from the last level's CPU per token)."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    if isinstance(value, str) and not value.strip().isdigit():
        raise UserError(f"{arg.flag} {value!r}: expected a whole number >= 1 or auto")
    return checks.positive_int(value, arg)


def _depths(value: Any, arg: Arg) -> list[int]:
    """Static draft depths to measure, 1 to 16 (0, no drafting, is always measured)."""
    if not value:
        return list(arg.default)
    try:
        return sorted(checks.int_list(value, arg))
    except UserError:
        raise UserError(
            f"{arg.flag} {value!r}: expected draft depths such as 1,2,3,5,7, each from 1 to "
            f"{arg.most:g} (0 is always measured)"
        ) from None


def _choice(*allowed: str) -> Any:
    def check(value: Any, arg: Arg) -> Any:
        if value is None:
            return arg.default
        if value not in allowed:
            said = (
                ", ".join(allowed[:-1]) + " or " + allowed[-1] if len(allowed) > 1 else allowed[0]
            )
            raise UserError(f"{arg.flag} {value!r}: expected {said}")
        return value

    return check


def _patterns(value: Any, arg: Arg) -> list[str]:
    return list(value or [])


def _names(value: Any, arg: Arg) -> list[str]:
    """A comma list (or the flag repeated) of names, blanks dropped."""
    raw = [value] if isinstance(value, str) else list(value or [])
    return [n.strip() for chunk in raw for n in str(chunk).split(",") if n.strip()]


count, positive_int, positive_float = (
    checks.non_negative_int,
    checks.positive_int,
    (checks.positive_float),
)


# --- what several tasks share ---------------------------------------------------------


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
    return Option("archive root", _archive, default=None,
                  default_text=f"{DEFAULT_ROOT}/ or $GPUFLEET_ARCHIVE", short="a")  # fmt: skip


CONCURRENCY_REQUIRED = Rule(
    lambda o: not o.concurrency, "--concurrency is required (e.g. --concurrency 1,10,64)"
)


def request_options() -> OptionSet:
    """The options of a benchmark request, shared by bench, sweep and tune."""
    return OptionSet(
        BenchRequest,
        backend=Option("sglang (/generate), openai (/v1/completions), openai-chat (any "
                       "OpenAI-compatible server); default: the profile's engine's (openai "
                       "for llamacpp and vllm, else sglang)", _choice(*BACKENDS)),
        concurrency=Option("levels, comma separated and/or repeated (e.g. 1,10,64)", _levels,
                           iterable=True, short="c", most=100_000),
        num_prompts=Option("requests per level", _nonzero(count), default_text="max(10, 4 x C)",
                           most=100_000),
        duration=Option("seconds per level instead of a request count",
                        _nonzero(positive_float), most=7 * DAY),
        request_rate=Option("Poisson arrivals per second (default: all at once, capped by C)",
                            _nonzero(positive_float), most=1_000_000,
                            expected="a rate in requests per second, such as 4"),
        output_len=Option("output tokens per request, ignore_eos on", positive_int,
                          most=1_000_000),
        prompts=Option("coding, chat, random (words), random-ids (token-exact), a JSONL file "
                       "or a ShareGPT JSON file"),
        seed=Option("prompt order seed (same seed = same prompts for every profile)", count,
                    most=2**32 - 1),
        workload=Option("single, multiturn[:turns=N] (sessions; C counts sessions), "
                        "shared-prefix[:groups=G,per_group=P,prefix_len=L,question_len=Q]",
                        _workload),
        trace=Option("replay a Mooncake-format JSONL trace at its timestamps "
                     "(e.g. playbooks/traces/mooncake-sample.jsonl)"),
        trace_speedup=Option("replay the trace this many times faster", positive_float,
                             most=10_000, expected="a factor, such as 2"),
        random_input_len=Option("prompt length: words for --prompts random, tokens for "
                                "random-ids", positive_int, most=1_000_000),
        random_output_len=Option("random-ids: output tokens", positive_int,
                                 default_text="--output-len", most=1_000_000),
        random_vocab=Option("token ids are drawn below this (random-ids, shared-prefix, "
                            "traces): the model's vocabulary size when it is under 30000",
                            positive_int, most=10_000_000,
                            expected="a vocabulary size, such as 512"),
        random_range_ratio=Option("random-ids: lengths uniform in [len x ratio, len]",
                                  positive_float, default_text="1: exact", most=1,
                                  expected="a ratio above 0 and at most 1, such as 0.5"),
        slo=Option("per-request SLO, e.g. ttft_ms=500,tpot_ms=50,e2e_ms=20000: goodput and "
                   "attainment", _slo, default=None),
        flush=Option("flush the server's prefix cache before each level (--no-flush keeps it)",
                     field="flush_cache", flag_default=True, default=True, default_text="on"),
        repeat=Option("run the levels N times, in rounds, for 95% confidence intervals",
                      positive_int, most=100),
        client_procs=Option("load generator processes per level on the host (N), or auto: "
                            "from the last level's CPU per token", _client_procs, most=1024),
        archive=archive_option(),
    )  # fmt: skip


# --- gpu-clean, status, sysinfo, hosts --------------------------------------------------

CLEAN = OptionSet(
    CleanOptions,
    dry_run=Option("list what would be killed; kill nothing", flag_default=False, default=False,
                   short="n"),
    all_users=Option("also kill GPU processes of other users", flag_default=False, default=False),
    all_tenants=Option("also kill processes of other tenants: other PID namespaces and "
                       "container cgroups (Docker, Kubernetes, Slurm, LXC, Podman), display "
                       "servers", flag_default=False, default=False),
    timeout=Option("seconds to wait for every GPU to read 0 MiB", positive_float,
                   field="timeout_s", most=7 * DAY),
    grace=Option("seconds between SIGTERM and SIGKILL", positive_float, field="grace_s",
                 most=3600),
    tolerance=Option("MiB of NVML v2 `used` still accepted as clean", count,
                     field="tolerance_mib", most=10_000_000),
    pattern=Option("regex for a stale server's program, title or Python module, never a "
                   "whole command line (repeatable; default: every engine's own processes, "
                   "as control/server/engines.py names them)",
                   _patterns, field="patterns", iterable=True,
                   default=None),
    include_running=Option("also kill servers that answer /health 200 (left alone by default)",
                           flag_default=False, default=False),
    clear_xid=Option("GPU indexes (e.g. 3 or 0,3) you have reset (nvidia-smi -r -i N): their "
                     "fatal XIDs stop refusing launches; needs --reason, logged on the host",
                     _gpu_indexes, field="clear_xids", iterable=True, default=None, most=1024),
    reason=Option("why the XIDs are cleared (with --clear-xid), kept in the host's log",
                  field="clear_reason"),
    json=switch("print the per-host results as JSON"),
) | fleet_options(CleanOptions)  # fmt: skip

STATUS = OptionSet(json=switch("print JSON")) | fleet_options()
SYSINFO = fleet_options()
HOSTS = fleet_options().only("inventory")

# --- launch, wait, stop, logs -------------------------------------------------------------

LAUNCH = OptionSet(
    LaunchOptions,
    Rule(lambda o: not o.profile, "launch needs --profile NAME (see `inv profiles`)"),
    profile=Option("profile name under playbooks/ (or a YAML path)", short="p", to_request=False),
    dry_run=switch("print the exact argv and environment per host; start nothing", short="n"),
    replace=Option("stop a server already running on the port first", flag_default=False),
    clean=Option("run gpu-clean on the hosts first", flag_default=False),
    engine=Option("override the engine (e.g. sim to rehearse a profile)",
                  _choice(*ENGINE_NAMES)),
    timeout=Option("seconds to wait for health", _nonzero(positive_float), field="timeout_s",
                   default_text="the profile's health_timeout", most=7 * DAY),
    skip_flag_check=Option("do not check flags against the engine's --help on the host",
                           flag_default=False),
    allow_unhealthy=Option("launch even on a GPU the health check calls bad (recorded)",
                           flag_default=False),
) | fleet_options(LaunchOptions)  # fmt: skip

WAIT = OptionSet(
    profile=Option("take the port from this profile", short="p"),
    port=Option("server port", _nonzero(count), default=None, default_text="30000",
                most=PORT_MAX),
    timeout=Option("seconds to wait for health", positive_float, default=HEALTH_TIMEOUT_S,
                   most=7 * DAY),
) | fleet_options()  # fmt: skip

STOP = OptionSet(
    StopArgs,
    profile=Option("only servers of this profile", short="p"),
    port=Option("only the server on this port", _nonzero(count), most=PORT_MAX),
    grace=Option("seconds between SIGTERM and SIGKILL", positive_float, field="grace_s",
                 most=3600),
    timeout=Option("seconds to wait for the GPUs to read 0 MiB", positive_float,
                   field="timeout_s", most=7 * DAY),
) | fleet_options(StopArgs)  # fmt: skip

LOGS = OptionSet(
    LogsArgs,
    profile=Option("the latest server of this profile", short="p"),
    port=Option("the server on this port", _nonzero(count), most=PORT_MAX),
    lines=Option("how many lines", count, most=1_000_000),
    follow=Option("keep printing new lines (Ctrl-C ends)", flag_default=False, default=False),
) | fleet_options(LogsArgs)  # fmt: skip

# --- bench, runs, compare, report -----------------------------------------------------------

BENCH = (
    request_options()
    | OptionSet(
        BenchRequest,
        Rule(lambda o: not (o.concurrency or o.attach or o.find_max),
             CONCURRENCY_REQUIRED.message),
        Rule(lambda o: o.client == "local" and o.find_max,
             "--find-max runs on the hosts: drop --client local"),
        Rule(lambda o: o.api_key_env and o.client != "local",
             "--api-key-env is for --client local (on the hosts the key is read from the "
             "launched server)"),
        profile=Option("bench the running server of this profile (default: the one running)",
                       short="p"),
        port=Option("bench the server on this port", _nonzero(count), most=PORT_MAX),
        warmup=Option("warm-up requests per level, excluded from figures", count, most=1000),
        client=Option("host (the generator runs on the GPU host) or local",
                      _choice("host", "local"), default="host", to_request=False),
        url=Option("server URL for --client local"),
        api_key_env=Option("--client local: name of the environment variable holding the "
                           "server's API key (sent as Authorization: Bearer; never printed or "
                           "archived)"),
        attach=Option("re-attach to RUN_ID on the hosts and fetch it", default=None,
                      to_request=False),
        engine=Option("gpufleet or sglang-bench: SGLang's own bench_serving on the host",
                      _choice("gpufleet", "sglang-bench")),
        tokenizer=Option("tokenizer path for --engine sglang-bench",
                         default_text="the served model"),
        telemetry_interval=Option("seconds between GPU power/utilisation samples (0: off)",
                                  _interval, field="telemetry_interval_s", most=60),
        output_details=Option("add bench_serving's per-request arrays (ttfts, itls, ...) to "
                              "results", flag_default=False, default=False),
        find_max=switch("search the highest load that holds --slo (each probe archived)"),
        by=Option("--find-max searches concurrency (--concurrency = where to start) or "
                  "request-rate", _choice(*FIND_MAX_LIMIT), default="concurrency",
                  to_request=False),
        target=Option("--find-max: share of requests that must meet the SLO", positive_float,
                      default=0.99, most=1, to_request=False,
                      expected="a share above 0 and at most 1, such as 0.99"),
        max_load=Option("--find-max: highest load to try", positive_float, default=None,
                        default_text=" / ".join(f"{v} for {k}" for k, v in
                                                FIND_MAX_LIMIT.items()),
                        most=1_000_000, to_request=False,
                        expected="a load (concurrency or requests per second), such as 256"),
        max_probes=Option("--find-max: at most this many runs per host", positive_int,
                          default=12, most=100, to_request=False),
    )
    | fleet_options(BenchRequest)
)  # fmt: skip

RUNS = OptionSet(
    host=Option("only runs of this host"),
    profile=Option("only runs of this profile", short="p"),
    since=Option("only runs started on or after this date (YYYY-MM-DD)"),
    verify=switch("check every archived file against the manifest's sha256"),
    archive=archive_option(),
)

COMPARE = OptionSet(
    None,
    Rule(lambda o: len([n for n in (o.first, o.second, *o.more) if n]) < 2,
         "compare needs two or more run ids or profile names (e.g. baseline eagle3)"),
    first=Option("reference: a run id or a profile name (its latest run per host)",
                 required=True),
    second=Option("run id or profile to compare with the reference", required=True),
    more=Option("more runs or profiles to overlay (repeatable)", _names, iterable=True,
                default=None),
    format=Option("table, md, csv or json", _choice("table", "md", "csv", "json"),
                  default="table"),
    hosts=Option("only these hosts (comma list)", _names, default=None, short="H"),
    archive=archive_option(),
    no_plots=switch("do not write PNG plots"),
    wide=switch("every metric in the terminal table (default: the headline columns)"),
    strict=switch("refuse runs whose fingerprints differ in what changes speed (GPU, power "
                  "limit, clocks, driver, engine version, ...)"),
)  # fmt: skip

REPORT = OptionSet(
    None,
    Rule(lambda o: sum(bool(x) for x in (o.sweep, o.runs, o.latest)) != 1,
         "report needs exactly one of --latest, --sweep ID or --runs A,B"),
    sweep=Option(f"a sweep id (the name of {DEFAULT_ROOT}/sweeps/<id>.json)"),
    runs=Option("run ids or profiles, comma separated (a profile: its latest successful run)",
                _names),
    latest=switch("the newest sweep"),
    hosts=Option("only these hosts (comma list)", _names, default=None, short="H"),
    archive=archive_option(),
)  # fmt: skip

# --- sweep, tune, rehearse --------------------------------------------------------------------


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


SWEEP = OptionSet(
    BenchRequest,
    profiles=Option("comma-separated profiles, the first is the reference (e.g. "
                    "baseline,eagle3)", _names, required=True, to_request=False),
) | experiment_options() | OptionSet(
    BenchRequest,
    dry_run=switch("print the plan; start nothing", short="n"),
    fail_fast=switch("stop at the first failed cell"),
    grid=Option("server flag values to sweep, repeatable: FLAG=V1,V2 (e.g. "
                "speculative-num-steps=1,3,5); every combination is a cell, relaunched",
                iterable=True, default=None, to_request=False),
    repeat=Option("measure every cell N times, interleaved, for confidence intervals",
                  positive_int, default=1, to_request=False, most=100),
)  # fmt: skip

TUNE = OptionSet(
    BenchRequest,
    profile=Option("a drafting profile to tune: SGLang EAGLE/EAGLE3 (e.g. eagle3-adaptive) or "
                   "llama.cpp with a draft model", required=True,
                   to_request=False, short="p"),
    depths=Option("static draft depths to measure besides 0 (topk 1)", _depths,
                  default=[1, 2, 3, 5, 7], most=16, to_request=False),
    min_request_speed=Option("per-request tok/s floor: a depth below it is not chosen",
                             _nonzero(positive_float), default=None, to_request=False,
                             most=1_000_000, expected="a speed in tokens per second, such as 20"),
    name=Option("name of the tuned profile", default=None, default_text="<profile>-tuned",
                to_request=False),
    verify=Option("run tuned vs no drafting vs static afterwards (--no-verify skips)",
                  flag_default=True, default=True, default_text="on", to_request=False),
    repeat=Option("measure every level N times on each server, in rounds: cells are judged by "
                  "median minus spread, noisy or failed ones rejected", positive_int, most=100),
    budget=Option("seconds the tune may take: the least informative cells are dropped to fit "
                  "(bursts, load step, depth 0's skip variant, deep depths; each said)",
                  _nonzero(positive_float), default=None, to_request=False, most=30 * 86400,
                  expected="seconds, such as 1800"),
) | experiment_options().replace(
    "concurrency", help="the load ladder", default=TUNE_LADDER
)  # fmt: skip

REHEARSE = OptionSet(
    inventory=Option("inventory", default="hosts/rehearsal.yaml", short="i"),
    hosts=fleet_options().options["hosts"],
    archive=archive_option(),
    resume=switch("finish an interrupted rehearsal"),
)
