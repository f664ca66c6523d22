"""Tasks that read the archive: compare and report."""

from __future__ import annotations

from typing import Any

from gpufleet.cli.common import (
    task,
    user_errors,
)


@task(
    positional=["first", "second"],
    iterable=["more"],
    help={
        "first": "reference: a run id or a profile name (its latest run per host)",
        "second": "run id or profile to compare with the reference",
        "more": "more runs or profiles to overlay (repeatable)",
        "format": "table (default), md, csv or json",
        "hosts": "only these hosts (comma list)",
        "archive": "archive root (default: logs/ or $GPUFLEET_ARCHIVE)",
        "no-plots": "do not write PNG plots",
        "wide": "every metric in the terminal table (default: the headline columns)",
        "strict": "refuse runs whose fingerprints differ in what changes speed (GPU, power "
        "limit, clocks, driver, engine version, ...)",
    },
)
@user_errors
def compare(
    c,
    first,
    second,
    more=None,
    format="table",
    hosts=None,
    archive=None,
    no_plots=False,
    wide=False,
    strict=False,
):
    """Per-concurrency table, crossover, plots and report.html: inv compare baseline eagle3."""
    from pathlib import Path

    from gpufleet.archive import select
    from gpufleet.archive.layout import DEFAULT_ROOT, Layout
    from gpufleet.errors import UserError

    names = [n for n in (first, second, *(more or [])) if n]
    if len(names) < 2:
        raise UserError("compare needs two or more run ids or profile names (e.g. baseline eagle3)")
    if format not in ("table", "md", "csv", "json"):
        raise UserError(f"--format {format!r}: expected table, md, csv or json")
    root = Path(archive) if archive else DEFAULT_ROOT
    data = select.report_for_runs(root, names, hosts.split(",") if hosts else None)
    if strict:
        from gpufleet.report.compare import strict_refusal

        for host, arms in data.per_host.items():
            refusal = strict_refusal(arms)
            if refusal:
                raise UserError(f"{host}: {refusal}")
    out_dir = Layout(root).compare_dir("-vs-".join(names))
    show_compare(data, format, out_dir, plots=not no_plots, wide=wide)
    if format != "json":
        from gpufleet.cli.output import line
        from gpufleet.report.capacity import compare_line

        for host in data.per_host:
            answers = select.find_max_answers(root, host, names)
            if answers:
                line(f"{host}: {compare_line(answers)}")


def show_compare(data: Any, fmt: str, out_dir: Any, plots: bool = True, wide: bool = False) -> None:
    """Print the comparison; write its plots and report.html (paths printed unless json)."""
    from gpufleet.archive import select, store
    from gpufleet.cli.output import line, print_compare
    from gpufleet.report.figures import write_all

    print_compare(data.per_host, fmt, wide)
    store.make_dirs(out_dir)
    written = write_all(data.per_host, out_dir) if plots else []
    page = select.write_report(data, out_dir)
    select.write_summary(data, out_dir)
    if fmt != "json":
        if written:  # the folder, not every path: one short line, not 200 columns
            line(f"plots: {out_dir}/ ({len(written)} PNG files)")
        line(f"report: {page}")


@task(
    help={
        "sweep": "a sweep id (the name of logs/sweeps/<id>.json)",
        "runs": "run ids or profiles, comma separated (a profile: its latest successful run)",
        "latest": "the newest sweep",
        "hosts": "only these hosts (comma list)",
        "archive": "archive root (default: logs/ or $GPUFLEET_ARCHIVE)",
    },
)
@user_errors
def report(c, sweep=None, runs=None, latest=False, hosts=None, archive=None):
    """Write one self-contained report.html (a sweep, or runs side by side); print its path.

    `inv report --latest`, `inv report --sweep ID`, `inv report --runs baseline,eagle3`.
    """
    from pathlib import Path

    from gpufleet.archive import select
    from gpufleet.archive.layout import DEFAULT_ROOT, Layout
    from gpufleet.cli.output import line
    from gpufleet.errors import UserError

    root = Path(archive) if archive else DEFAULT_ROOT
    if sum(bool(x) for x in (sweep, runs, latest)) != 1:
        raise UserError("report needs exactly one of --latest, --sweep ID or --runs A,B")
    if runs:
        names = [n.strip() for n in runs.split(",") if n.strip()]
        data = select.report_for_runs(root, names, hosts.split(",") if hosts else None)
        out_dir = Layout(root).compare_dir("-vs-".join(names))
    else:
        state_path = select.sweep_state_path(root, sweep)
        data = select.report_for_sweep(root, state_path)
        out_dir = Layout(root).compare_dir(state_path.stem)
    page = select.write_report(data, out_dir)
    select.write_summary(data, out_dir)
    line(f"report: {page}")
