"""Tasks that read the archive: compare and report."""

from __future__ import annotations

from typing import Any

from gpufleet.archive.layout import DEFAULT_ROOT
from gpufleet.cli.args import choice, name_list
from gpufleet.cli.common_options import (
    archive_option,
)
from gpufleet.cli.options import Option, OptionSet, Rule, switch

COMPARE = OptionSet(
    None,
    Rule(lambda o: len([n for n in (o.first, o.second, *o.more) if n]) < 2,
         "compare needs two or more run ids or profile names (e.g. baseline eagle3)"),
    first=Option("reference: a run id or a profile name (its latest run per host)",
                 required=True),
    second=Option("run id or profile to compare with the reference", required=True),
    more=Option("more runs or profiles to overlay (repeatable)", name_list, iterable=True,
                default=None),
    format=Option("table, md, csv or json", choice("table", "md", "csv", "json"),
                  default="table"),
    hosts=Option("only these hosts (comma list)", name_list, default=None, short="H"),
    archive=archive_option(),
    no_plots=switch("do not write PNG plots"),
    wide=switch("every metric in the terminal table (default: the headline columns)"),
    strict=switch("refuse runs whose fingerprints differ in what changes speed (GPU, power "
                  "limit, clocks, driver, engine version, ...)"),
)  # fmt: skip

REPORT = OptionSet(
    None,
    Rule(lambda o: sum(bool(x) for x in (o.sweep, o.runs, o.latest, o.fleet)) != 1,
         "report needs exactly one of --latest, --sweep ID, --runs A,B or --fleet PROFILE"),
    sweep=Option(f"a sweep id (the name of {DEFAULT_ROOT}/sweeps/<id>.json)"),
    runs=Option("run ids or profiles, comma separated (a profile: its latest successful run)",
                name_list),
    latest=switch("the newest sweep"),
    fleet=Option("a profile: its hosts side by side, the ratio plot with the hosts named off "
                 "the fleet (inv fleet's view)"),
    hosts=Option("only these hosts (comma list)", name_list, default=None, short="H"),
    archive=archive_option(),
)  # fmt: skip


@COMPARE.task()
def compare(c, **given):
    """Per-concurrency table, crossover, plots and report.html: inv compare baseline eagle3."""
    from gpufleet.errors import UserError
    from gpufleet.report import select

    o = COMPARE.parse(given)
    names = [n for n in (o.first, o.second, *o.more) if n]
    root = o.archive
    data = select.report_for_runs(root, names, o.hosts or None)
    if o.strict:
        from gpufleet.report.compare import strict_refusal

        for host, arms in data.per_host.items():
            refusal = strict_refusal(arms)
            if refusal:
                raise UserError(f"{host}: {refusal}")
    out_dir = root.compare_dir("-vs-".join(names))
    if o.format != "json" and data.title != " vs ".join(names):
        from gpufleet.cli.output import line

        line(data.title)  # which sweep's repeats it reads
    show_compare(data, o.format, out_dir, plots=not o.no_plots, wide=o.wide)
    if o.format != "json":
        from gpufleet.cli.output import line
        from gpufleet.report.capacity import compare_line

        for host in data.per_host:
            answers = select.find_max_answers(root, host, names)
            if answers:
                line(f"{host}: {compare_line(answers)}")


def show_compare(data: Any, fmt: str, out_dir: Any, plots: bool = True, wide: bool = False) -> None:
    """Print the comparison; write its plots and report.html (paths printed unless json)."""
    import dataclasses

    from gpufleet.archive import store
    from gpufleet.cli.output import line, print_compare
    from gpufleet.report import select
    from gpufleet.report.figures import write_all

    print_compare(data.per_host, fmt, wide)
    store.make_dirs(out_dir)
    written: list[Any] = []
    if plots:  # each figure drawn once, for the PNG and the page's SVG
        svgs, written = write_all(data.per_host, out_dir)
        data = dataclasses.replace(data, plots=svgs)
    page = select.write_report(data, out_dir)
    select.write_summary(data, out_dir)
    if fmt != "json":
        if written:  # the folder, not every path: one short line, not 200 columns
            line(f"plots: {out_dir}/ ({len(written)} PNG files)")
        line(f"report: {page}")


@REPORT.task()
def report(c, **given):
    """Write one self-contained report.html (a sweep, or runs side by side); print its path.

    `inv report --latest`, `inv report --sweep ID`, `inv report --runs baseline,eagle3`.
    """
    from gpufleet.cli.output import line
    from gpufleet.report import select

    o = REPORT.parse(given)
    root = o.archive
    if o.fleet:
        _fleet_report(root, o.fleet)
        return
    if o.runs:
        data = select.report_for_runs(root, o.runs, o.hosts or None)
        out_dir = root.compare_dir("-vs-".join(o.runs))
    else:
        state_path = select.sweep_state_path(root, o.sweep)
        data = select.report_for_sweep(root, state_path)
        out_dir = root.compare_dir(state_path.stem)
    page = select.write_report(data, out_dir)
    select.write_summary(data, out_dir)
    line(f"report: {page}")


def _fleet_report(root: Any, profile: str) -> None:
    """`inv report --fleet P`: summary.md, ratios.png and report.html of the fleet view."""
    from gpufleet.cli.output import line
    from gpufleet.fleet import outliers, page
    from gpufleet.fleet.index import open_index

    with open_index(root) as index:
        view = outliers.fleet_view(index, profile)
    written = page.write(view, root.fleet_dir(profile))
    line(f"report: {written[-1]}")
