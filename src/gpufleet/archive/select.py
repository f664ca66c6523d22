"""Pick archived runs for a comparison: by run id, by profile (latest per host), by sweep.

Reads `logs/<host>/<run-id>/` and hands the report layer `Arm`s (one run's levels and
manifest each); the report never reads the archive itself.
"""

from __future__ import annotations

import json
from pathlib import Path

from gpufleet.archive import store
from gpufleet.errors import UserError
from gpufleet.report.compare import Arm


def load_arm(label: str, run_dirs: list[Path]) -> Arm:
    arm = Arm(label=label, manifests=[])
    for run_dir in run_dirs:
        arm.manifests.append(store.read_manifest(run_dir))
        for line in (run_dir / "results.jsonl").read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                arm.levels[int(row["max_concurrency"])] = row
    return arm


def _runs_named(arg: str, runs: list[dict]) -> dict[str, list[Path]]:
    """host -> run dir for one argument: a run id, else a profile's latest run per host."""
    found: dict[str, list[Path]] = {}
    by_id = [r for r in runs if r.get("run_id") == arg]
    if by_id:
        for r in by_id:
            found[r["host"]] = [Path(r["path"])]
        return found
    # sorted by start time: the latest wins, and a successful run beats any failed one
    usable = [r for r in runs if r.get("profile") == arg and r.get("levels")]
    for r in usable:
        found[r["host"]] = [Path(r["path"])]
    for r in usable:
        if r.get("status") == "done" and not r.get("superseded"):
            found[r["host"]] = [Path(r["path"])]
    return found


def resolve(args: list[str], root: Path, hosts: list[str] | None = None) -> dict[str, list[Arm]]:
    """host -> arms (one per argument), for the hosts where every argument has a run."""
    runs = store.list_runs(root)
    per_arg = []
    for arg in args:
        found = _runs_named(arg, runs)
        if not found:
            raise UserError(f"{arg!r}: no archived run or profile of that name under {root}/")
        per_arg.append(found)
    common = sorted(set.intersection(*(set(f) for f in per_arg)))
    if hosts:
        common = [h for h in common if h in hosts]
    if not common:
        raise UserError("the runs to compare share no host (compare runs of the same host)")
    return {h: [load_arm(arg, f[h]) for arg, f in zip(args, per_arg, strict=True)] for h in common}


def from_run_ids(root: Path, by_profile: dict[str, dict[str, str]]) -> dict[str, list[Arm]]:
    """host -> arms, from a sweep's finished cells (profile -> host -> run id)."""
    hosts = sorted(set.intersection(*(set(h) for h in by_profile.values()))) if by_profile else []
    return {
        host: [
            load_arm(profile, [root / host / runs[host]]) for profile, runs in by_profile.items()
        ]
        for host in hosts
    }
