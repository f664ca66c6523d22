"""A run's manifest, built from the files the host wrote during the run.

Everything about the server comes from what was launched (the host's state file, copied
into the run as server_state.json: argv, redacted environment, engine version and the
profile as resolved at launch), never from `playbooks/` as it is now. Secrets are hidden
before the files get here (control/bench.py).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

SCHEMA = 1
SERVER_KEYS = (
    "argv", "env", "engine", "engine_version", "port", "profile", "log", "started_at",
    "flag_renames", "secrets_in_argv",
)  # fmt: skip
HOST_FACT_KEYS = ("driver", "cuda", "gpus", "packages", "hostname", "simulated")


class FetchedRun:
    """The parsed JSON files of a run as fetched from the host."""

    def __init__(self, files: dict[str, bytes], watched_status: str) -> None:
        self.files = files
        self.plan = self._load("plan.json") or {}
        self.status = self._load("status.json") or {"status": watched_status}
        self.server_state = self._load("server_state.json") or {}
        self.sysinfo = self._load("sysinfo.json") or {}
        text = files.get("results.jsonl", b"").decode()
        self.results = [json.loads(line) for line in text.splitlines() if line.strip()]

    def _load(self, name: str) -> Any:
        try:
            return json.loads(self.files[name]) if name in self.files else None
        except ValueError:
            return None


def build(
    host: str, run_id: str, run: FetchedRun, command_line: list[str], version: str
) -> dict[str, Any]:
    """The manifest of one run (store.write_run adds the sha256 of every file)."""
    plan, status, results = run.plan, run.status, run.results
    return {
        "schema": SCHEMA,
        "run_id": run_id,
        "host": host,
        "profile": plan.get("profile") or run.server_state.get("profile"),
        "status": status["status"],
        "reason": status.get("reason"),
        "started_at": (results[0].get("started_at") if results else None) or status.get("at"),
        "finished_at": status.get("at"),
        "archived_at": datetime.now(UTC).isoformat(),
        "gpufleet_version": version,
        "command_line": command_line,
        "plan": plan,
        "server": {k: run.server_state.get(k) for k in SERVER_KEYS},
        "resolved_profile": run.server_state.get("resolved_profile"),
        "host_facts": {k: run.sysinfo.get(k) for k in HOST_FACT_KEYS},
        "prompt_set": {
            "name": plan.get("prompt_set"),
            "sha256": plan.get("prompt_set_sha256"),
            "prompts_sha256": plan.get("prompts_sha256"),
            "seed": plan.get("seed"),
        },
        "levels": [
            {
                "concurrency": r["max_concurrency"],
                "status": r.get("level_status"),
                "output_throughput": r["output_throughput"],
                **({"repeat": r["repeat"]} if r.get("repeat", 1) != 1 else {}),
            }
            for r in results
        ],
    }
