"""inv bench: plan a sweep of concurrency levels, run it on each host (detached), fetch and
archive it. Also `--client local` (the same generator here, against a URL) and `--attach`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from gpufleet import __version__
from gpufleet.archive import manifest
from gpufleet.archive.layout import profile_label
from gpufleet.archive.store import RunStaging
from gpufleet.control.bench import intake, workloads
from gpufleet.control.bench import prompts as prompt_sets
from gpufleet.control.bench.request import BenchRequest, check_combination
from gpufleet.control.connect.base import Progress, ResumableCall, Session, host_events
from gpufleet.control.connect.cancel import SLICE_S, CancelToken
from gpufleet.control.connect.fanout import FleetResult, HostResult
from gpufleet.control.connect.fleet import Fleet
from gpufleet.control.inventory.model import Host
from gpufleet.control.server import engines
from gpufleet.errors import HostError, UserError
from gpufleet.host.agent.protocol import (
    BenchStartArgs,
    BenchWatchAnswer,
    BenchWatchArgs,
    StatusArgs,
)
from gpufleet.host.agent.redact import redact_argv, redact_tree, remember
from gpufleet.host.bench.clients import CLIENTS
from gpufleet.host.bench.dialects import NAMES as BACKENDS
from gpufleet.kinds import Kind, RunStatus
from gpufleet.records import BenchPlan, Level, PromptRow, RandomLengths, ResultRow
from gpufleet.report.tables import summary_csv, summary_md
from gpufleet.terminal import shown
from gpufleet.wire import carried

CONTROL_FILES = {"runner.json"}


@dataclass
class ArchivedRun:
    """A run once archived: where it is, how it ended, its level rows (results.jsonl) and,
    for a failed run, the server log's last lines."""

    run_id: str
    path: str
    status: str  # kinds.RunStatus
    reason: str | None = None
    results: list[ResultRow] = field(default_factory=list)
    tail: list[str] = field(default_factory=list)

    @property
    def done(self) -> bool:
        """The run finished every level."""
        return self.status == RunStatus.DONE


def make_run_id(request: BenchRequest, hosts: list[str], served: str | None = None) -> str:
    """`<UTC stamp>-<profile>-<digest>`: the profile asked for, else the one the hosts'
    servers run (`served_profile`), else `adhoc`."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    digest = hashlib.sha256(json.dumps([request.__dict__, hosts], default=str).encode())
    named = request.profile or served
    label = profile_label(named) if named else "adhoc"
    label = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in label)[:40]
    return f"{stamp}-{label}-{digest.hexdigest()[:6]}"


def served_profile(fleet: Fleet, request: BenchRequest) -> str | None:
    """The profile of the server a bench without --profile will measure, as the host will
    pick it (alive, on --port if given, the latest started), when every host runs the same
    one; None when they differ, run none or cannot say (the bench itself reports that)."""
    if request.profile:
        return request.profile

    def picked(session: Session) -> str | None:
        servers = session.call(StatusArgs(servers_only=True)).servers
        alive = [s for s in servers if s.alive and request.port in (None, s.port)]
        return max(alive, key=lambda s: s.started_at).profile if alive else None

    names = {res.value if res.ok else None for res in fleet.each(picked)}
    return names.pop() if len(names) == 1 else None


def fresh_run_id(request: BenchRequest, fleet: Fleet) -> str:
    """A new run's id, named after the profile asked for or the one the hosts serve; bad
    input is refused first, before any host is asked."""
    build_plan(request, "check")
    return make_run_id(request, fleet.names, served_profile(fleet, request))


def _rows(
    request: BenchRequest,
) -> tuple[str, str, list[PromptRow], list[Level], dict[str, RandomLengths]]:
    """(label, digest of the source set, prompts.jsonl rows, levels, extra plan keys)."""
    workload = workloads.parse_workload(request.workload)
    if request.trace:
        if workload.name != "single" or request.prompts not in ("coding", request.trace):
            raise UserError("--trace replays its own requests: drop --workload and --prompts")
        rows = workloads.load_trace(request.trace, request.trace_speedup, request.random_vocab)
        speed = f"x{request.trace_speedup:g}" if request.trace_speedup != 1 else ""
        label = f"trace:{Path(request.trace).name}{speed}"
        if request.trace_prompts:
            label, rows = _texts_on_arrivals(request, rows, label)
        return label, _digest(rows), rows, request.levels(len(rows)), {}
    levels = request.levels()
    count = max(lv.num_prompts for lv in levels)
    if request.prompts == "random-ids":
        if workload.name != "single":
            raise UserError(f"--prompts random-ids: not with --workload {workload.name}")
        out = request.random_output_len or request.output_len
        ratio = request.random_range_ratio
        vocab = request.random_vocab
        rows = workloads.random_ids(count, request.seed, input_len=request.random_input_len,
                                    output_len=out, ratio=ratio, vocab=vocab)  # fmt: skip
        label = f"random-ids-{request.random_input_len}-{out}"
        label += f"-r{ratio:g}" if ratio < 1 else ""
        label += f"-v{vocab}" if vocab != workloads.ID_HIGH else ""
        lengths = {"input_len": request.random_input_len, "output_len": out, "range_ratio": ratio}
        return label, _digest(rows), rows, levels, {"random": lengths}
    if workload.name == "shared-prefix":
        rows = workloads.shared_prefix(count, request.seed, workload.options, request.random_vocab)
        return workload.label, _digest(rows), rows, levels, {}
    label, texts = prompt_sets.load_texts(request.prompts, request.seed, request.random_input_len)
    if workload.name == "multiturn":
        rows = workloads.multiturn(texts, count, request.seed, workload.options["turns"])
        extra = {"system_prompt": workloads.system_prompt()}
        return f"{label}+{workload.label}", prompt_sets.digest(texts), rows, levels, extra
    rows = [PromptRow(prompt=t) for t in prompt_sets.sample(texts, count, request.seed)]
    return label, prompt_sets.digest(texts), rows, levels, {}


def _texts_on_arrivals(
    request: BenchRequest, rows: list[PromptRow], label: str
) -> tuple[str, list[PromptRow]]:
    """The trace's arrival times and output lengths carrying the texts of a prompt set
    (`inv tune`'s bursts replay the tune's own prompts: an engine's acceptance depends on
    what is asked, and a trace's token ids read as neither code nor chat)."""
    assert request.trace_prompts
    name, texts = prompt_sets.load_texts(
        request.trace_prompts, request.seed, request.random_input_len
    )
    picked = prompt_sets.sample(texts, len(rows), request.seed)
    rows = [
        PromptRow(prompt=t, output_len=r.output_len, at=r.at)
        for t, r in zip(picked, rows, strict=True)
    ]
    return f"{name}@{label}", rows


def _digest(rows: list[PromptRow]) -> str:
    return prompt_sets.digest([json.dumps(row.to_wire(), sort_keys=True) for row in rows])


def _engine_of(profile: str | None) -> Any:
    """The adapter of the profile's engine, where the profile can be read here."""
    from gpufleet.control.server.profiles import load_profile

    if profile:
        try:
            return engines.engine(load_profile(profile).engine)
        except UserError:
            pass
    return None


def engine_backend(profile: str | None) -> str:
    """The dialect the profile's engine speaks (llama.cpp's and vLLM's: openai), where
    the profile can be read here; else SGLang's."""
    adapter = _engine_of(profile)
    return adapter.backend if adapter else BenchPlan.backend


def build_plan(request: BenchRequest, run_id: str) -> tuple[BenchPlan, bytes]:
    """The plan a host runs (levels, prompts, engine dialect, cache flush) and the prompt rows it
    uploads, from the request; bad combinations are one UserError."""
    if request.engine not in CLIENTS:
        raise UserError(f"--engine {request.engine!r}: expected {' or '.join(CLIENTS)}")
    # the engine the caller resolved (a sweep cell), else the profile's, read once
    adapter = engines.ENGINES.get(request.server_engine or "") or _engine_of(request.profile)
    if request.backend is None:
        request = replace(request, backend=adapter.backend if adapter else BenchPlan.backend)
    if request.backend not in BACKENDS:
        raise UserError(f"--backend {request.backend!r}: expected one of {', '.join(BACKENDS)}")
    label, set_digest, rows, levels, extra = _rows(request)
    check_combination(request, rows, label)
    if request.repeat > 1:  # rounds, not back to back: a slow drift spreads over every level
        levels = [replace(lv, repeat=r) for r in range(1, request.repeat + 1) for lv in levels]
    plan = carried(  # every field the plan shares with the request is the request's
        BenchPlan,
        request,
        run_id=run_id,
        levels=levels,
        profile=profile_label(request.profile) if request.profile else None,
        base_url=request.url.rstrip("/") if request.url else None,
        metric_names=engines.gauge_names(adapter.name if adapter else None),
        salt_prompts=request.flush_cache and adapter is not None and not adapter.flushes_cache,
        slo=dict(request.slo or {}),
        prompt_set=label,
        workload=workloads.parse_workload(request.workload).label if not request.trace else "trace",
        prompt_set_sha256=set_digest,
        prompts_sha256=_digest(rows),
        **extra,
    )
    body = "".join(json.dumps(row.to_wire()) + "\n" for row in rows).encode()
    return plan, body


def archive_run(staging: RunStaging, request: BenchRequest, watch: BenchWatchAnswer) -> ArchivedRun:
    """Archive a run whose files are in `staging` (fetched, or written here): its records
    read back to their bound, its manifest built, renamed into <root>/<host>/<run_id>/."""
    read = {name: intake.record(staging, name) for name in manifest.RECORDS}
    files = {name: data for name, data in read.items() if data is not None}
    if "plan.json" in files:  # a URL given with a password stays out of the archive
        plan = redact_tree(json.loads(files["plan.json"]))
        files["plan.json"] = json.dumps(plan, indent=2).encode()
        staging.add("plan.json", files["plan.json"])
    run = manifest.FetchedRun(files, watch.get("status", RunStatus.FAILED))
    command_line = redact_argv(request.command_line)
    record = manifest.build(staging.host, staging.run_id, run, command_line, __version__)
    for name in CONTROL_FILES:
        staging.drop(name)
    staging.add("summary.csv", summary_csv(run.results).encode())
    staging.add("summary.md", shown(summary_md(record, run.results)).encode())  # as on a terminal
    tail = []
    if run.status["status"] != RunStatus.DONE:
        tail = intake.log_tail(staging, "server.log")
    path = staging.commit(record)
    return ArchivedRun(
        record.run_id, str(path), run.status["status"], run.status.get("reason"), run.results, tail
    )


def attach_hint(run_id: str, hosts: list[Host], archive: Any = None) -> str:
    """The command that fetches a run still going on on these hosts, pasteable as is: with
    the inventory and the archive that decide where it lands (issue 81.7: pasted without
    the bench's `--archive`, it archived into the default folder)."""
    names = ",".join(h.name for h in hosts)
    where = f" --archive {shlex.quote(os.path.abspath(str(archive)))}" if archive else ""
    return (
        f"inv bench --attach {run_id} --hosts {names}{hosts[0].cli_hint() if hosts else ''}{where}"
    )


def watch(
    session: Session,
    run_id: str,
    progress: Progress | None,
    cancel: CancelToken | None = None,
    resume: str | None = None,
) -> BenchWatchAnswer:
    """Stream a run's progress until it ends. With a cancel token, watch in slices and raise
    Cancelled when a stop is asked: the run goes on on the host, to be fetched later.
    `resume`: how to fetch it after a lost connection (default: `inv bench --attach`)."""
    name = session.host.name
    shown = host_events(name, progress)
    ended: list[str] = []  # how the host saw the run end, before any answer came back

    def on_event(event: Any) -> None:
        if event.get("phase") == "finished":
            ended.append(str(event.get("status")))
        if shown is not None:
            shown(event)

    args = BenchWatchArgs(run_id=run_id)
    if cancel is not None:
        args.timeout_s = SLICE_S

    def carry_on(answer: BenchWatchAnswer) -> bool:
        args.offset = answer.get("offset", args.offset)
        return answer["status"] == RunStatus.WATCHING

    how = resume or f"fetch it with `{attach_hint(run_id, [session.host])}`"
    call = ResumableCall("watching the benchmark", how)
    try:
        return session.call_in_slices(args, on_event, call, cancel, carry_on)
    except HostError as exc:
        raise finished_not_fetched(exc, name, RunStatus.DONE in ended, how) from None


def finished_not_fetched(exc: HostError, host: str, finished: bool, resume: str) -> HostError:
    """A job that ended once its run had finished on the node (the watch saw `done`) took
    only the way to fetch it, not the run: said as not fetched (a sweep keeps the cell
    `benching`), with the one way to fetch it; any other error as it was (issue 81.7)."""
    if exc.kind != Kind.JOB_ENDED or not finished:
        return exc
    return HostError(f"{exc}; the run had finished on {host} before that and stays there: "
                     f"{resume}", kind=Kind.CONNECTION)  # fmt: skip


def fetch(
    session: Session,
    run_id: str,
    request: BenchRequest,
    *,
    progress: Progress | None,
    cancel: CancelToken | None = None,
    resume: str | None = None,
) -> ArchivedRun:
    """Watch a run on the host until it ends, download its files, archive them. `resume`:
    the one way to fetch it that a lost connection names (a sweep's: its --resume)."""
    resume = resume or f"fetch it with `{attach_hint(run_id, [session.host], request.archive)}`"
    answer = watch(session, run_id, progress, cancel, resume)
    with RunStaging(request.archive, session.host.name, run_id) as staging:
        try:
            refused = intake.receive(staging, answer, session.download_to)
        except HostError as exc:  # the run finished and stays on the host: say how to fetch it
            done = answer["status"] == RunStatus.DONE
            if exc.kind == Kind.JOB_ENDED and done:
                raise finished_not_fetched(exc, session.host.name, done, resume) from None
            raise HostError(f"{exc}; the run finished on {session.host.name} and stays there: "
                            f"{resume}", exc.kind, exc.tail) from None  # fmt: skip
        for line in [*intake.cleared(staging), *refused]:
            if progress:
                progress(session.host.name, {"warning": line})
        return archive_run(staging, request, answer)


def start(session: Session, request: BenchRequest, run_id: str, progress: Progress | None) -> None:
    """Upload the prompts and start the run detached on the host (it survives SSH)."""
    plan, body = build_plan(request, run_id)
    session.hold_steps()
    incoming = f"{session.workdir}/.incoming-{run_id}.jsonl"
    session.upload(body, incoming)
    started = session.call(BenchStartArgs(plan=plan, prompts_file=incoming))
    if progress:
        progress(
            session.host.name,
            {"phase": "started", "run_id": run_id, "base_url": started["base_url"]},
        )
        queued = queueing_warning(request.concurrency, started.get("slots"), started.get("engine"))
        if queued:
            progress(session.host.name, {"warning": queued})


def queueing_warning(levels: list[int], slots: int | None, engine: str | None) -> str | None:
    """Levels above the requests the server serves at once measure its queue: said, with
    the engine's flag that sets it; silent where every level fits or nobody knows."""
    over = [c for c in levels if slots is not None and c > slots]
    if not over:
        return None
    flag = engines.ENGINES[engine].slots_flag if engine in engines.ENGINES else ""
    setting = f" (--{flag})" if flag else ""
    return (
        f"C={','.join(map(str, over))} above the {slots} requests the server serves at once"
        f"{setting}: the rest wait in its queue, and TTFT and E2E include that wait"
    )


def bench_on(
    session: Session, request: BenchRequest, run_id: str, progress: Progress | None
) -> ArchivedRun:
    """Start the run on one host and follow it to the archive."""
    start(session, request, run_id, progress)
    return fetch(session, run_id, request, progress=progress)


def bench(
    fleet: Fleet,
    request: BenchRequest,
    run_id: str,
    progress: Progress | None = None,
    on_done: Callable[[HostResult[ArchivedRun]], None] | None = None,
) -> FleetResult[ArchivedRun]:
    """Run one benchmark (run id from make_run_id) on every host and archive it per host."""
    build_plan(request, run_id)  # bad input fails here, before any host is touched
    return _fail_unfinished(fleet.each(lambda s: bench_on(s, request, run_id, progress), on_done))


def attach(
    fleet: Fleet,
    run_id: str,
    request: BenchRequest,
    progress: Progress | None = None,
    on_done: Callable[[HostResult[ArchivedRun]], None] | None = None,
) -> FleetResult[ArchivedRun]:
    """Follow a run already started on each host (`--attach`) to the archive; a run that has not
    finished is a failure naming it."""
    return _fail_unfinished(
        fleet.each(lambda s: fetch(s, run_id, request, progress=progress), on_done)
    )


def _fail_unfinished(results: FleetResult[ArchivedRun]) -> FleetResult[ArchivedRun]:
    """A run archived as failed fails its host (the archive and its table are kept)."""
    for res in results:
        if res.ok and res.value is not None and not res.value.done:
            res.error = f"run archived as FAILED: {res.value.reason}"
            res.kind = Kind.RUN_FAILED
            res.tail = res.value.tail
    return results


def _local_keys(variable: str | None) -> dict[str, str]:
    """The server's key for `--client local`, from the environment variable the user named."""
    if not variable:
        return {}
    value = os.environ.get(variable)
    if not value:
        raise UserError(f"--api-key-env {variable}: the environment variable is not set")
    remember([value])
    return {"api-key": value}


def bench_local(request: BenchRequest, progress: Progress | None = None) -> tuple[str, ArchivedRun]:
    """`--client local`: the same runner in this process against `--url`; archived here."""
    from gpufleet.host.bench.runner import run_plan

    if not request.url:
        raise UserError("--client local needs --url http://HOST:PORT")
    parsed = urlparse(request.url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise UserError(f"--url {request.url!r}: expected http://HOST:PORT")
    label = f"{parsed.hostname}_{parsed.port or 80}"
    run_id = make_run_id(request, [label])
    plan, body = build_plan(request, run_id)
    with tempfile.TemporaryDirectory(prefix="gpufleet-run-") as tmp:
        run_dir = Path(tmp)
        if request.metrics:
            plan.metrics_url = request.url.rstrip("/") + "/metrics"
        (run_dir / "plan.json").write_text(plan.to_json())
        (run_dir / "prompts.jsonl").write_bytes(body)
        outcome = run_plan(run_dir, None, {}, keys=_local_keys(request.api_key_env))
        answer = intake.local_run(run_dir, outcome)
        with RunStaging(request.archive, label, run_id) as staging:
            refused = intake.receive(staging, answer, intake.read_local)
            # the same bounds as a host's run: said, the rest archived
            for line in [*intake.cleared(staging), *refused]:
                if progress:
                    progress(label, {"warning": line})
            return run_id, archive_run(staging, request, answer)
