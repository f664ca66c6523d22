"""A run's manifest, built from the files the host wrote during the run.

Everything about the server comes from what was launched (the host's state file, copied
into the run as server_state.json: argv, redacted environment, engine version and the
profile as resolved at launch), never from `playbooks/` as it is now. Secrets are hidden
before the files get here (control/bench/run.py).
"""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime
from typing import Any, TypeVar

from gpufleet.archive.kept import HostFacts, LevelOutcome, Manifest, PromptSetRef, ServerFacts
from gpufleet.archive.store import parse_results
from gpufleet.records import BenchPlan
from gpufleet.wire import JsonObject, Record, WireError

R = TypeVar("R", bound=Record)
# the files of a run the manifest is built from (read whole: control/bench/intake.py bounds them)
RECORDS = ("plan.json", "status.json", "server_state.json", "sysinfo.json", "results.jsonl")


class FetchedRun:
    """The parsed JSON files of a run as fetched from the host."""

    def __init__(self, files: dict[str, bytes], watched_status: str) -> None:
        self.files = files
        plan = self._load("plan.json")
        try:
            self.plan = BenchPlan.from_wire(plan, "plan.json") if plan else None
        except WireError:
            self.plan = None  # written by another gpufleet: the run is archived, unplanned
        self.status = self._load("status.json") or {"status": watched_status}
        self.server_state = self._load("server_state.json") or {}
        self.sysinfo = self._load("sysinfo.json") or {}
        text = files.get("results.jsonl", b"").decode()
        self.results = parse_results(text, "results.jsonl")

    def _load(self, name: str) -> Any:
        try:
            return json.loads(self.files[name]) if name in self.files else None
        except ValueError:
            return None


def _pick(record: type[R], data: JsonObject) -> R:  # a file as read, unchecked
    """The fields of `record` that `data` has (the rest of a state file stays on the host)."""
    names = {f.name for f in dataclasses.fields(record)}  # type: ignore[arg-type]
    return record.from_wire({k: v for k, v in data.items() if k in names})


LAUNCHED = "launched by gpufleet: its port's listener was checked before each level"


def origin(plan: BenchPlan | None, state: object) -> str | None:
    """Who launched the server the run measured: gpufleet (whose listener the runner
    checked, host/server/listener.py), or someone else, benched on purpose with --url."""
    if state:
        return LAUNCHED
    if plan and plan.base_url:
        return (f"launched outside gpufleet, benched on purpose at {plan.base_url} (--url): "
                "whose server answers there was not checked")  # fmt: skip
    return None


def build(
    host: str, run_id: str, run: FetchedRun, command_line: list[str], version: str
) -> Manifest:
    """The manifest of one run (store.write_run adds the sha256 of every file)."""
    plan, status, results = run.plan, run.status, run.results
    return Manifest(
        run_id=run_id,
        host=host,
        profile=(plan.profile if plan else None) or run.server_state.get("profile"),
        status=status["status"],
        reason=status.get("reason"),
        started_at=(results[0].started_at if results else None) or status.get("at"),
        finished_at=status.get("at"),
        archived_at=datetime.now(UTC).isoformat(),
        gpufleet_version=version,
        command_line=command_line,
        plan=plan,
        server=_pick(ServerFacts, run.server_state),
        server_origin=origin(plan, run.server_state),
        resolved_profile=run.server_state.get("resolved_profile"),
        host_facts=_pick(HostFacts, run.sysinfo),
        prompt_set=PromptSetRef(
            name=plan.prompt_set if plan else None,
            sha256=plan.prompt_set_sha256 if plan else None,
            prompts_sha256=plan.prompts_sha256 if plan else None,
            seed=plan.seed if plan else None,
        ),
        levels=[
            LevelOutcome(
                concurrency=r.max_concurrency,
                status=r.level_status,
                output_throughput=r.output_throughput,
                repeat=r.repeat,
            )
            for r in results
        ],
    )
