"""Task options declared once: help, default, how a value is checked, and which field of the
request it sets. The task's signature (what Invoke parses), its help text with the default
said, the one-line error a bad value gets and the `--resume` line (cli/experiments.py reads
the signature) all come from the declaration; the default itself comes from the request type
(control/benchrequest.BenchRequest, whose shared defaults are records.BenchPlan's; for
gpu-clean, stop and logs, their verb arguments in host/protocol.py).

To add an option to bench, sweep, tune, gpu-clean, stop or logs: one Option in the set its
task is built from below (`request_options` is what bench, sweep and tune share), naming its
request field; nothing else.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpufleet.cli import args as checks
from gpufleet.cli.common import task, user_errors
from gpufleet.errors import UserError

Check = Callable[[Any, str, Any], Any]  # (value as given, --flag, default) -> value
FROM_REQUEST = object()  # the default is the request field's own


def _as_given(value: Any, flag: str, default: Any) -> Any:
    return default if value is None else value


def _nonzero(check: Check) -> Check:
    """A number where 0 or absent means "not set" (None): --port, --duration."""
    return lambda value, flag, default: check(value, flag, 0) or default


def _levels(value: Any, flag: str, default: Any) -> list[int]:
    return checks.int_list(value, flag)


def _gpu_indexes(value: Any, flag: str, default: Any) -> list[int]:
    return checks.int_list(value, flag, least=0)


def _interval(value: Any, flag: str, default: Any) -> float:
    """Seconds, where 0 turns it off (--telemetry-interval)."""
    if value is not None and str(value).strip() in ("0", "0.0"):
        return 0.0
    return checks.positive_float(value, flag, default)


def _slo(value: Any, flag: str, default: Any) -> dict[str, float]:
    from gpufleet.host.bench.slo import parse_slo

    try:
        return parse_slo(value)
    except ValueError as exc:
        raise UserError(f"{flag} {value}: {exc}") from None


def _workload(value: Any, flag: str, default: Any) -> str:
    from gpufleet.control.workloads import parse_workload

    parse_workload(value)  # a bad name or option: one line now
    return value or default


def _archive(value: Any, flag: str, default: Any) -> Any:
    from pathlib import Path

    return Path(value) if value else default


def _client_procs(value: Any, flag: str, default: Any) -> int | str:
    """N generator processes per level, or `auto` (from the last level's CPU per token)."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    if isinstance(value, str) and not value.strip().isdigit():
        raise UserError(f"{flag} {value!r}: expected a whole number >= 1 or auto")
    return checks.positive_int(value, flag, default)


def _choice(*allowed: str) -> Check:
    def check(value: Any, flag: str, default: Any) -> Any:
        if value is None:
            return default
        if value not in allowed:
            raise UserError(f"{flag} {value!r}: expected {' or '.join(allowed)}")
        return value

    return check


@dataclass(frozen=True)
class Option:
    help: str
    check: Check = _as_given
    field: str | None = None  # the request field it sets (same name when None)
    default: Any = FROM_REQUEST
    default_text: str | None = None  # the default in words when it is computed
    flag_default: Any = None  # what Invoke sees: True/False makes a boolean flag
    iterable: bool = False
    required: bool = False
    to_request: bool = True  # False: the task's own (a sweep's --repeat repeats cells)


class OptionSet:
    """A task's options: its signature, help and parsed values from one declaration."""

    def __init__(self, request_type: type, **options: Option) -> None:
        self.request_type = request_type
        self.options = options
        self._fields = {f.name: f for f in dataclasses.fields(request_type)}

    def __or__(self, other: OptionSet) -> OptionSet:
        return OptionSet(self.request_type, **self.options, **other.options)

    def only(self, *names: str) -> OptionSet:
        return OptionSet(self.request_type, **{n: self.options[n] for n in names})

    def default(self, name: str) -> Any:
        option = self.options[name]
        if option.default is not FROM_REQUEST:
            return option.default
        field = self._fields.get(option.field or name)
        if field is None:
            return None
        if field.default_factory is not dataclasses.MISSING:
            return field.default_factory()
        return None if field.default is dataclasses.MISSING else field.default

    def help(self) -> dict[str, str]:
        out = {}
        for name, option in self.options.items():
            default = option.default_text or self.default(name)
            said = (
                ""
                if default is None or default is False or default == ""
                else f" (default {default})"
            )
            out[name.replace("_", "-")] = option.help + said
        return out

    def signature(self) -> inspect.Signature:
        params = [inspect.Parameter("c", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
        for name, option in self.options.items():
            default = inspect.Parameter.empty if option.required else option.flag_default
            params.append(
                inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default)
            )
        return inspect.Signature(params)

    def parse(self, given: dict[str, Any]) -> dict[str, Any]:
        """Each option's checked value (its default when not given)."""
        out = {}
        for name, option in self.options.items():
            flag = "--" + name.replace("_", "-")
            value = given.get(name)
            if option.flag_default is not None and value is not None:
                out[name] = bool(value)  # a boolean flag
            else:
                out[name] = option.check(value, flag, self.default(name))
        return out

    def request_fields(self, parsed: dict[str, Any]) -> dict[str, Any]:
        """The parsed values that are request fields, by field name."""
        return {
            option.field or name: parsed[name]
            for name, option in self.options.items()
            if option.to_request and (option.field or name) in self._fields
        }

    def task(self, **task_kwargs: Any) -> Callable[[Callable[..., Any]], Any]:
        """`@task` whose signature and help are this set's (the body takes `c, **given`)."""

        def wrap(body: Callable[..., Any]) -> Any:
            checked = user_errors(body)

            @functools.wraps(checked)
            def entry(c: Any, *positional: Any, **given: Any) -> Any:
                names = [n for n, o in self.options.items() if o.required]
                given.update(zip(names, positional, strict=False))
                return checked(c, **given)

            entry.__signature__ = self.signature()  # type: ignore[attr-defined]
            iterable = [n for n, o in self.options.items() if o.iterable]
            return task(help=self.help(), iterable=iterable, **task_kwargs)(entry)

        return wrap


def request_options(request_type: type) -> OptionSet:
    """The options of a benchmark request, shared by bench and sweep."""
    positive_int, positive_float = checks.positive_int, checks.positive_float
    count = checks.non_negative_int
    return OptionSet(
        request_type,
        concurrency=Option("levels, comma separated and/or repeated (e.g. 1,10,64)", _levels,
                           iterable=True),
        num_prompts=Option("requests per level", _nonzero(count),
                           default_text="max(10, 4 x C)"),
        duration=Option("seconds per level instead of a request count",
                        _nonzero(positive_float)),
        request_rate=Option("Poisson arrivals per second (default: all at once, capped by C)",
                            _nonzero(positive_float)),
        output_len=Option("output tokens per request, ignore_eos on", positive_int),
        prompts=Option("coding, chat, random (words), random-ids (token-exact), a JSONL file "
                       "or a ShareGPT JSON file"),
        seed=Option("prompt order seed (same seed = same prompts for every profile)", count),
        workload=Option("single, multiturn[:turns=N] (sessions; C counts sessions), "
                        "shared-prefix[:groups=G,per_group=P,prefix_len=L,question_len=Q]",
                        _workload),
        trace=Option("replay a Mooncake-format JSONL trace at its timestamps "
                     "(e.g. playbooks/traces/mooncake-sample.jsonl)"),
        trace_speedup=Option("replay the trace this many times faster", positive_float),
        random_input_len=Option("prompt length: words for --prompts random, tokens for "
                                "random-ids", positive_int),
        random_output_len=Option("random-ids: output tokens", positive_int,
                                 default_text="--output-len"),
        random_range_ratio=Option("random-ids: lengths uniform in [len x ratio, len]",
                                  positive_float, default_text="1: exact"),
        slo=Option("per-request SLO, e.g. ttft_ms=500,tpot_ms=50,e2e_ms=20000: goodput and "
                   "attainment", _slo, default=None),
        flush=Option("flush the server's prefix cache before each level (--no-flush keeps it)",
                     field="flush_cache", flag_default=True, default=True,
                     default_text="on"),
        repeat=Option("run the levels N times, in rounds, for 95% confidence intervals",
                      positive_int),
        client_procs=Option("load generator processes per level on the host (N), or auto: "
                            "from the last level's CPU per token", _client_procs),
        archive=Option("archive root", _archive, field="archive_root",
                       default_text="logs/ or $GPUFLEET_ARCHIVE"),
    )  # fmt: skip


def bench_options(request_type: type) -> OptionSet:
    """inv bench: the request's options, the server's and the client's, find-max, hosts."""
    count, positive_int = checks.non_negative_int, checks.positive_int
    positive_float = checks.positive_float
    return (
        request_options(request_type)
        | OptionSet(
            request_type,
            profile=Option("bench the running server of this profile (default: the one running)"),
            port=Option("bench the server on this port", _nonzero(count)),
            backend=Option("sglang (/generate), openai (/v1/completions), openai-chat"),
            warmup=Option("warm-up requests per level, excluded from figures", count),
            client=Option(
                "host (the generator runs on the GPU host) or local",
                _choice("host", "local"),
                default="host",
            ),
            url=Option("server URL for --client local"),
            api_key_env=Option(
                "--client local: name of the environment variable holding the "
                "server's API key (sent as Authorization: Bearer; never printed or "
                "archived)"
            ),
            attach=Option("re-attach to RUN_ID on the hosts and fetch it", default=None),
            engine=Option(
                "gpufleet or sglang-bench: SGLang's own bench_serving on the host",
                _choice("gpufleet", "sglang-bench"),
            ),
            tokenizer=Option(
                "tokenizer path for --engine sglang-bench", default_text="the served model"
            ),
            telemetry_interval=Option(
                "seconds between GPU power/utilisation samples (0: off)",
                _interval,
                field="telemetry_interval_s",
            ),
            output_details=Option(
                "add bench_serving's per-request arrays (ttfts, itls, ...) to results",
                flag_default=False,
                default=False,
            ),
            find_max=Option(
                "search the highest load that holds --slo (each probe archived)",
                flag_default=False,
                default=False,
            ),
            by=Option(
                "--find-max searches concurrency (--concurrency = where to start) or request-rate",
                _choice("concurrency", "request-rate"),
                default="concurrency",
            ),
            target=Option(
                "--find-max: share of requests that must meet the SLO", positive_float, default=0.99
            ),
            max_load=Option(
                "--find-max: highest load to try",
                positive_float,
                default=None,
                default_text="1024 / 1000 req/s",
            ),
            max_probes=Option(
                "--find-max: at most this many runs per host", positive_int, default=12
            ),
        )
        | fleet_options(request_type)
    )


def fleet_options(request_type: type) -> OptionSet:
    from gpufleet.cli.common import HOSTS_HELP, INVENTORY_HELP

    return OptionSet(
        request_type,
        hosts=Option(HOSTS_HELP, default=None),
        inventory=Option(INVENTORY_HELP, default=None),
        forks=Option("hosts in parallel (default: the inventory's forks, 32)", default=None),
    )


_SWITCH: dict[str, Any] = {"flag_default": False, "default": False, "to_request": False}


def experiment_options(request_type: type) -> OptionSet:
    """What sweep and tune share: the request's options a cell benches with, and the
    experiment's own (resume, engine override, hosts)."""
    return (
        request_options(request_type).only(
            "concurrency",
            "num_prompts",
            "output_len",
            "prompts",
            "seed",
            "workload",
            "trace",
            "trace_speedup",
            "random_input_len",
            "random_output_len",
            "random_range_ratio",
            "slo",
            "flush",
            "archive",
        )
        | OptionSet(
            request_type,
            resume=Option(
                "finish the latest run of this experiment (re-attach, re-run failed cells)",
                **_SWITCH,
            ),
            engine=Option(
                "override the server engine (sim to rehearse)", default=None, to_request=False
            ),
            allow_unhealthy=Option(
                "launch even on a GPU the health check calls bad (recorded in each run)",
                **_SWITCH,
            ),
        )
        | fleet_options(request_type)
    )


def sweep_options(request_type: type) -> OptionSet:
    profiles = Option(
        "comma-separated profiles, the first is the reference (e.g. baseline,eagle3)",
        required=True,
        to_request=False,
    )
    return OptionSet(request_type, profiles=profiles) | experiment_options(request_type) | (
        OptionSet(
            request_type,
            dry_run=Option("print the plan; start nothing", **_SWITCH),
            fail_fast=Option("stop at the first failed cell", **_SWITCH),
            grid=Option("server flag values to sweep, repeatable: FLAG=V1,V2 (e.g. "
                        "speculative-num-steps=1,3,5); every combination is a cell, relaunched",
                        iterable=True, default=None, to_request=False),
            repeat=Option("measure every cell N times, interleaved, for confidence intervals",
                          checks.positive_int, default=1, to_request=False),
        )
    )  # fmt: skip


def tune_options(request_type: type, ladder: str) -> OptionSet:
    options = experiment_options(request_type)
    options.options["concurrency"] = Option(
        "the load ladder", _levels, iterable=True, default_text=ladder
    )
    return OptionSet(
        request_type,
        profile=Option("an EAGLE/EAGLE3 profile to tune (e.g. eagle3-adaptive)", required=True,
                       to_request=False),
        depths=Option("static draft depths to measure besides 0 (topk 1)", default=None,
                      default_text="1,2,3,5,7", to_request=False),
        min_request_speed=Option("per-request tok/s floor: a depth below it is not chosen",
                                 _nonzero(checks.positive_float), default=None, to_request=False),
        name=Option("name of the tuned profile", default=None, default_text="<profile>-tuned",
                    to_request=False),
        verify=Option("run tuned vs no drafting vs static afterwards (--no-verify skips)",
                      flag_default=True, default=True, default_text="on", to_request=False),
        repeat=Option("measure every level N times on each server, in rounds: cells are "
                      "judged by median minus spread, noisy or failed ones rejected",
                      checks.positive_int),
    ) | options  # fmt: skip


def _patterns(value: Any, flag: str, default: Any) -> list[str]:
    return list(value or [])


def clean_options() -> OptionSet:
    """inv gpu-clean: what may be killed, how long to wait, hosts. The defaults are the
    agent's own (host/protocol.py: CleanArgs), through control/gpuclean.CleanOptions."""
    from gpufleet.control.cleanoptions import CleanOptions

    switch = {"flag_default": False, "default": False}
    return OptionSet(
        CleanOptions,
        dry_run=Option("list what would be killed; kill nothing", **switch),
        all_users=Option("also kill GPU processes of other users", **switch),
        all_tenants=Option(
            "also kill processes of other tenants: other PID namespaces and "
            "container cgroups (Docker, Kubernetes, Slurm, LXC, Podman), display "
            "servers",
            **switch,
        ),
        timeout=Option(
            "seconds to wait for every GPU to read 0 MiB", checks.positive_float, field="timeout_s"
        ),
        grace=Option("seconds between SIGTERM and SIGKILL", checks.positive_float, field="grace_s"),
        tolerance=Option(
            "MiB of NVML v2 `used` still accepted as clean",
            checks.non_negative_int,
            field="tolerance_mib",
        ),
        pattern=Option(
            "regex for a stale server's program, title or Python module, never a "
            "whole command line (repeatable; default: the SGLang family and "
            "gpufleet's rehearsal server)",
            _patterns,
            field="patterns",
            iterable=True,
            default=None,
        ),
        include_running=Option(
            "also kill servers that answer /health 200 (left alone by default)", **switch
        ),
        clear_xid=Option(
            "GPU indexes (e.g. 3 or 0,3) you have reset (nvidia-smi -r -i N): their fatal XIDs "
            "stop refusing launches; needs --reason, logged on the host",
            _gpu_indexes,
            field="clear_xids",
            iterable=True,
            default=None,
        ),
        reason=Option(
            "why the XIDs are cleared (with --clear-xid), kept in the host's log",
            field="clear_reason",
        ),
        json=Option("print the per-host results as JSON", **switch, to_request=False),
    ) | fleet_options(CleanOptions)


def stop_options() -> OptionSet:
    """inv stop: which servers, how long to wait; the defaults are the verb's (StopArgs)."""
    from gpufleet.host.protocol import StopArgs

    return OptionSet(
        StopArgs,
        profile=Option("only servers of this profile"),
        port=Option("only the server on this port", _nonzero(checks.non_negative_int)),
        grace=Option("seconds between SIGTERM and SIGKILL", checks.positive_float,
                     field="grace_s"),
        timeout=Option("seconds to wait for the GPUs to read 0 MiB", checks.positive_float,
                       field="timeout_s"),
    ) | fleet_options(StopArgs)  # fmt: skip


def logs_options() -> OptionSet:
    """inv logs: which server, how many lines; the defaults are the verb's (LogsArgs)."""
    from gpufleet.host.protocol import LogsArgs

    return OptionSet(
        LogsArgs,
        profile=Option("the latest server of this profile"),
        port=Option("the server on this port", _nonzero(checks.non_negative_int)),
        lines=Option("how many lines", checks.non_negative_int),
        follow=Option("keep printing new lines (Ctrl-C ends)", flag_default=False, default=False),
    ) | fleet_options(LogsArgs)  # fmt: skip
