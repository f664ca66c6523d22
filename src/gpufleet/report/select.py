"""Pick archived runs for a comparison: by run id, by profile (latest per host), by sweep.

Reads `logs/<host>/<run-id>/` and hands the report layer `Arm`s (one run's levels and
manifest each); the report never reads the archive itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from gpufleet.archive import store
from gpufleet.archive.kept import FindMaxRecord, SweepRecord, TuneRecord
from gpufleet.archive.layout import Archive, profile_label
from gpufleet.errors import UserError
from gpufleet.kinds import CellStatus, RunStatus
from gpufleet.records import ResultRow
from gpufleet.report import html
from gpufleet.report.compare import Arm
from gpufleet.report.html import Failure, ReportInput
from gpufleet.report.stats import MIN_REPEATS_FOR_INTERVAL, LevelFigures, aggregate
from gpufleet.terminal import shown


def load_arm(label: str, run_dirs: list[Path]) -> Arm:
    """One arm from its runs: a level measured several times (`--repeat`, or several runs
    of a sweep's repeated cells) becomes the mean with its confidence interval."""
    arm = Arm(label=label, manifests=[])
    samples: dict[int, list[tuple[Path, ResultRow]]] = {}
    for run_dir in run_dirs:
        arm.manifests.append(store.read_manifest(run_dir))
        for row in store.read_results(run_dir):
            samples.setdefault(row.max_concurrency, []).append((run_dir, row))
    arm.levels = {c: _level(found) for c, found in sorted(samples.items())}
    return arm


def _level(found: list[tuple[Path, ResultRow]]) -> LevelFigures:
    """One level's repeats, with their requests where an interval will be drawn."""
    rows = [row for _, row in found]
    if len(rows) < MIN_REPEATS_FOR_INTERVAL:
        return aggregate(rows)
    return aggregate(rows, store.read_level_requests(found))


def _runs_named(arg: str, runs: list[store.ListedRun]) -> dict[str, list[Path]]:
    """host -> run dir for one argument: a run id, else a profile's latest run per host."""
    found: dict[str, list[Path]] = {}
    by_id = [r for r in runs if r.run_id == arg]
    for r in by_id:
        if r.manifest is None:
            raise UserError(f"{r.path / store.MANIFEST}: {r.problem}")
        found[r.host] = [r.path]
    if found:
        return found
    # sorted by start time: the latest wins, and a successful run beats any failed one
    usable = [r for r in runs if r.manifest and r.manifest.profile == arg and r.manifest.levels]
    for r in usable:
        found[r.host] = [r.path]
    for r in usable:
        if r.status == RunStatus.DONE:  # superseded runs read "failed (superseded)"
            found[r.host] = [r.path]
    return found


@dataclass
class SweepCell:
    """The finished runs of one sweep cell on one host: its repeats, in the order run."""

    sweep_id: str
    label: str
    run_ids: list[str]


def sweep_cells(archive: Archive) -> dict[tuple[str, str], SweepCell]:
    """(host, run id) -> the sweep cell it was a repeat of, newest sweep last (so it wins)."""
    out: dict[tuple[str, str], SweepCell] = {}
    for path in archive.sweep_states():
        try:
            state = SweepRecord.load(path)
        except UserError:
            continue  # an unreadable state names no runs; `inv sweep --resume` says why
        labels = {a["key"]: a["label"] for a in state.arms or []}
        by_cell: dict[tuple[str, str], list[str]] = {}
        for key, cells in state.cells.items():
            for host, cell in cells.items():
                if cell.status == CellStatus.DONE and cell.run_id:
                    label = labels.get(key, profile_label(key))
                    by_cell.setdefault((host, label), []).append(cell.run_id)
        for (host, label), run_ids in by_cell.items():
            for run_id in run_ids:
                out[(host, run_id)] = SweepCell(state.sweep_id, label, run_ids)
    return out


def _with_sweep_repeats(
    arg: str, found: dict[str, list[Path]], cells: dict[tuple[str, str], SweepCell],
    archive: Archive, said: list[str],
) -> dict[str, list[Path]]:  # fmt: skip
    """A profile's latest run, widened to every repeat of the sweep cell it came from: a
    sweep with `--repeat 3` gives compare three runs per arm, and an interval."""
    out = {}
    for host, paths in found.items():
        cell = cells.get((host, paths[-1].name))
        if cell is None or len(cell.run_ids) < 2:
            out[host] = paths
            continue
        out[host] = [archive.run_dir(host, run_id) for run_id in cell.run_ids]
        said.append(f"{arg}: every repeat of sweep {cell.sweep_id} ({len(cell.run_ids)} runs)")
    return out


def resolve(
    args: list[str], archive: Archive, hosts: list[str] | None = None,
    said: list[str] | None = None,
) -> dict[str, list[Arm]]:  # fmt: skip
    """host -> arms (one per argument), for the hosts where every argument has a run; a
    profile whose latest run was a repeated sweep cell reads every repeat (`said` hears so)."""
    runs = store.list_runs(archive)
    ids = {r.run_id for r in runs}
    cells = sweep_cells(archive)
    said = said if said is not None else []
    per_arg = []
    for arg in args:
        found = _runs_named(arg, runs)
        if not found:
            raise UserError(f"{arg!r}: no archived run or profile of that name under {archive}/")
        if arg not in ids:
            found = _with_sweep_repeats(arg, found, cells, archive, said)
        per_arg.append(found)
    common = sorted(set.intersection(*(set(f) for f in per_arg)))
    if hosts:
        common = [h for h in common if h in hosts]
    if not common:
        raise UserError("the runs to compare share no host (compare runs of the same host)")
    labels = _arm_labels(args, [f[common[0]] for f in per_arg], runs)
    return {
        h: [load_arm(label, f[h]) for label, f in zip(labels, per_arg, strict=True)] for h in common
    }


def _started(stamp: str | None) -> str:
    """`11-30 14:02` (UTC) from a manifest's ISO start time; empty when it has none."""
    try:
        return datetime.fromisoformat(stamp or "").strftime("%m-%d %H:%M")
    except ValueError:
        return ""


def _arm_labels(
    args: list[str], first_dirs: list[list[Path]], runs: list[store.ListedRun]
) -> list[str]:
    """A profile argument is its own label; a run id is labelled by the profile its manifest
    names (a run benched by hand has its server's) and when it started, so a report reads
    `baseline 11-30 14:02`, not a 40-character id. Two equal labels are the run ids."""
    ids = {r.run_id for r in runs}
    labels = []
    for arg, dirs in zip(args, first_dirs, strict=True):
        if arg not in ids:
            labels.append(arg)
            continue
        manifest = store.read_manifest(dirs[0])
        name = profile_label(manifest.profile) if manifest.profile else "unnamed"
        labels.append(f"{name} {_started(manifest.started_at)}".strip())
    return [
        label if labels.count(label) == 1 else arg for label, arg in zip(labels, args, strict=True)
    ]


def from_run_ids(
    archive: Archive, by_label: dict[str, dict[str, list[str]]]
) -> dict[str, list[Arm]]:
    """host -> arms, from a sweep's finished cells (label -> host -> run ids: a repeated
    cell has one run per repeat)."""
    hosts = sorted(set.intersection(*(set(h) for h in by_label.values()))) if by_label else []
    return {
        host: [
            load_arm(label, [archive.run_dir(host, run_id) for run_id in runs[host]])
            for label, runs in by_label.items()
        ]
        for host in hosts
    }


def _log_tail(run_dir: Path, lines: int = 40) -> list[str]:
    try:
        return (run_dir / "server.log").read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return []


def _report_input(title: str, per_host: dict[str, list[Arm]], archive: Archive) -> ReportInput:
    """Failures, run directories and checksum status for the runs of a comparison."""
    data = ReportInput(title=title, per_host=per_host)
    for host, arms in per_host.items():
        for arm in arms:
            for manifest in arm.manifests:
                run_dir = archive.run_dir(host, manifest.run_id)
                data.run_dirs[manifest.run_id] = run_dir
                problems = store.verify(run_dir)
                data.checksums[manifest.run_id] = "ok" if not problems else "; ".join(problems[:3])
                if manifest.status != RunStatus.DONE:
                    data.failures.append(
                        Failure(host, arm.label, str(manifest.reason), _log_tail(run_dir))
                    )
    return data


def report_for_runs(
    archive: Archive, names: list[str], hosts: list[str] | None = None
) -> ReportInput:
    """A report on run ids or profiles (latest successful run per host, or every repeat of
    the sweep cell it came from); the title names that sweep."""
    said: list[str] = []
    per_host = resolve(names, archive, hosts, said)
    title = " vs ".join(names)
    if said:
        title += " (" + "; ".join(dict.fromkeys(said)) + ")"
    return _report_input(title, per_host, archive)


def sweep_state_path(archive: Archive, sweep_id: str | None) -> Path:
    """A sweep's state file by id (`--latest`: the newest); UserError if there is none."""
    where = archive
    sweeps = where.sweep_states()
    if sweep_id is None:
        if not sweeps:
            raise UserError(f"no sweep under {where.sweeps_dir}/ (run inv sweep first)")
        return sweeps[-1]
    path = where.sweep_state(sweep_id)
    if not path.is_file():
        raise UserError(f"{sweep_id!r}: no sweep of that id under {where.sweeps_dir}/")
    return path


def report_for_sweep(archive: Archive, state_path: Path) -> ReportInput:
    """A report on a sweep: its finished cells compared, its failed cells listed."""
    state = SweepRecord.load(state_path)
    labels = {a["key"]: a["label"] for a in state.arms or []}
    finished: dict[str, dict[str, list[str]]] = {}
    for key, cells in state.cells.items():
        for host, cell in cells.items():
            if cell.status == CellStatus.DONE and cell.run_id:
                by_host = finished.setdefault(labels.get(key, profile_label(key)), {})
                by_host.setdefault(host, []).append(cell.run_id)
    per_host = from_run_ids(archive, finished) if finished else {}
    data = _report_input(f"sweep {state.sweep_id}", per_host, archive)
    data.headlines = tune_headlines(archive, state.sweep_id)
    for profile, cells in state.cells.items():
        for host, cell in cells.items():
            if cell.status != CellStatus.DONE and cell.error:
                run_dir = archive.run_dir(host, str(cell.run_id))
                tail = _log_tail(run_dir) if cell.run_id else []
                data.failures.append(Failure(host, profile_label(profile), cell.error, tail))
    return data


def tune_headlines(archive: Archive, sweep_id: str) -> dict[str, list[str]]:
    """host -> the headline sentences (issue 83.1) of the tune this sweep belongs to (its
    measurement, verification or a load shape), as its record keeps them; empty for a sweep
    no tune record names."""
    for path in archive.tune_records():
        try:
            record = TuneRecord.load(path)
        except UserError:
            continue
        checks = [*record.verify.values(), *record.step.values()]
        ids = {record.tune_id, *(c.get(k) for c in checks for k in _SHAPE_IDS)}
        if sweep_id in ids:
            return {host: [str(t) for t in check.get("headline", [])]
                    for host, check in record.step.items() if check.get("headline")}  # fmt: skip
    return {}


_SHAPE_IDS = ("sweep_id", "burst_sweep_id", "trace_sweep_id")


def find_max_answers(archive: Archive, host: str, labels: list[str]) -> dict[str, FindMaxRecord]:
    """The latest `inv bench --find-max` answer of each profile on this host, if any."""
    answers = {}
    for label in labels:
        found = archive.findmax_records(host, label)
        if found:
            answers[label] = FindMaxRecord.load(found[-1])
    return answers


def write_report(data: ReportInput, out_dir: Path) -> Path:
    """Render the report and write `out_dir/report.html` (archive mode, atomically)."""
    target = out_dir / "report.html"
    store.write_private_file(target, html.render(data, out_dir).encode())
    return target


def _md(text: str) -> str:
    """Free text from a record as Markdown shows it: on one line, no control character, raw
    HTML, link or emphasis."""
    from gpufleet.report.markdown import md_cell

    shown = "".join(ch for ch in str(text) if ch.isprintable() or ch in "\n\t")
    return md_cell("".join("\\" + ch if ch in "\\`*_[]<>&!#" else ch for ch in shown))


def write_summary(data: ReportInput, out_dir: Path) -> Path:
    """`out_dir/summary.md`: the same answers as the terminal and report.html, in Markdown."""
    from gpufleet.report import answer
    from gpufleet.report.compare import table

    answers = [answer.build(host, arms) for host, arms in data.per_host.items()]
    tables = {host: table(arms, wide=True) for host, arms in data.per_host.items()}
    target = out_dir / "summary.md"
    text = answer.to_markdown(data.title, answers, tables)
    if data.headlines:  # a tune's sweep: its headline per load shape, as the record says it
        said = [f"- **{_md(host)}:** {_md(line)}" for host, lines in data.headlines.items()
                for line in lines]  # fmt: skip
        text += "\n".join(["## The tune's headline", "", *said, ""])
    text = shown(text)  # control characters escaped as the terminal escapes them
    store.write_private_file(target, text.encode())
    return target
