"""Tasks across hosts and over time, read from the archive's index: fleet, history, metrics."""

from __future__ import annotations

from gpufleet.cli.args import choice, positive_float, positive_int
from gpufleet.cli.common_options import archive_option
from gpufleet.cli.options import Option, OptionSet, Rule, switch
from gpufleet.report import catalogue

DEFAULT_METRICS_PORT = 9464


def _metric() -> Option:
    return Option(
        "the figure compared, a results.jsonl key with a direction "
        "(e.g. median_per_request_output_tps, median_ttft_ms)",
        default=catalogue.THROUGHPUT,
    )


def _threshold() -> Option:
    return Option(
        "the smallest difference that counts, in percent",
        positive_float,
        default=5.0,
        most=100,
        expected="a percentage such as 5",
    )


FLEET = OptionSet(
    profile=Option(
        "the profile whose runs are set side by side (default: every profile "
        "run on two or more hosts)",
        short="p",
    ),
    latest=switch("only hosts whose newest run is of the newest round (sweep or bench)"),
    threshold=_threshold(),
    metric=_metric(),
    format=Option("table, md or json", choice("table", "md", "json"), default="table"),
    archive=archive_option(),
)

HISTORY = OptionSet(
    host=Option("only this host (default: every host)"),
    profile=Option("only this profile (default: every profile)", short="p"),
    threshold=_threshold(),
    metric=_metric(),
    fail_on_regression=Option(
        "exit 1 on a significant drop larger than this percent at any level",
        positive_float,
        default=None,
        most=100,
        expected="a percentage such as 5",
    ),
    format=Option("table or json", choice("table", "json"), default="table"),
    archive=archive_option(),
)

METRICS = OptionSet(
    None,
    Rule(
        lambda o: bool(o.output) == bool(o.serve),
        "metrics needs exactly one of --output FILE or --serve",
    ),
    output=Option("write the exposition to this file (node_exporter's textfile collector)"),
    serve=switch("serve /metrics until interrupted"),
    port=Option(
        "--serve: the port",
        positive_int,
        default=DEFAULT_METRICS_PORT,
        most=65535,
        expected="a port such as 9464",
    ),
    bind=Option("--serve: the address to listen on", default="127.0.0.1"),
    profile=Option("only this profile", short="p"),
    host=Option("only this host"),
    archive=archive_option(),
)


@FLEET.task()
def fleet(c, **given):
    """Which host is off the fleet: per level, the fleet's median and each host's ratio.

    `inv fleet --profile baseline`; exit 1 when a host is named (a job can gate on it).
    """
    from invoke.exceptions import Exit

    from gpufleet.cli.fleet_output import print_fleet
    from gpufleet.errors import UserError
    from gpufleet.fleet import outliers, page
    from gpufleet.fleet.index import reading

    o = FLEET.parse(given)

    def read(index):
        profiles = [o.profile] if o.profile else outliers.fleet_profiles(index)
        if not profiles:
            raise UserError(
                f"no profile was run on two or more hosts in {o.archive}/ "
                "(inv fleet sets hosts of one profile side by side)"
                + outliers.damaged_said(index.broken_lines())
            )
        return [
            outliers.fleet_view(index, p, o.metric, o.threshold / 100, o.latest) for p in profiles
        ]

    views, notes = reading(o.archive, read)
    pages = {v.profile: page.write(v, o.archive.fleet_dir(v.profile), plots=False) for v in views}
    print_fleet(views, o.format, notes, pages)
    named = sorted({n.host for v in views for n in v.named})
    if named:
        raise Exit(f"gpufleet: off the fleet: {', '.join(named)}", code=1)
    suspect = sorted({n.host for v in views for n in v.suspect})
    if suspect:  # exit 0: one round is not evidence enough to fail a gate
        import sys

        from gpufleet.cli.output import line

        line(f"gpufleet: suspect, measure again: {', '.join(suspect)}", sys.stderr)


@HISTORY.task()
def history(c, **given):
    """Did a host get slower since its earlier runs, and what changed between them.

    `inv history --host gpu1 --profile baseline --fail-on-regression 5`.
    """
    from invoke.exceptions import Exit

    from gpufleet.cli.fleet_output import print_history
    from gpufleet.fleet.history import histories, left_out_elsewhere
    from gpufleet.fleet.index import reading

    o = HISTORY.parse(given)

    def read(index):
        found = histories(index, o.host, o.profile, o.metric, o.threshold / 100)
        return found, left_out_elsewhere(index, found, o.host, o.profile)

    (found, damaged), notes = reading(o.archive, read)
    print_history(found, o.format, notes, damaged)
    suspect = [f"{h.host} {h.profile} C={lv.concurrency} {lv.change:+.1%}" for h in found
               for lv in h.suspects()]  # fmt: skip
    if suspect:  # one round is not evidence enough to fail a gate: said, exit 0
        import sys

        from gpufleet.cli.output import line

        line(f"gpufleet: suspect, measure again: {'; '.join(suspect)}", sys.stderr)
    if o.fail_on_regression is not None:
        drop = o.fail_on_regression / 100
        worse = [
            f"{h.host} {h.profile} C={lv.concurrency} {lv.change:+.1%}"
            for h in found
            for lv in h.regressions(drop)
        ]
        if worse:
            raise Exit(
                f"gpufleet: slower by more than {o.fail_on_regression:g}%: " + "; ".join(worse),
                code=1,
            )


@METRICS.task()
def metrics(c, **given):
    """The archive's figures for Prometheus: a textfile, or /metrics served.

    `inv metrics --output /var/lib/node_exporter/gpufleet.prom`, `inv metrics --serve`.
    """
    import time
    from pathlib import Path

    from gpufleet.cli.output import line
    from gpufleet.fleet import openmetrics

    o = METRICS.parse(given)
    if o.host or o.profile:
        from gpufleet.fleet.history import known
        from gpufleet.fleet.index import reading

        reading(o.archive, lambda index: known(index, o.host, o.profile))  # one line for a
        # name the archive lacks
    if o.output:
        samples = openmetrics.write_file(o.archive, Path(o.output), o.profile, o.host)
        line(f"metrics: {o.output} ({samples} samples)")
        return
    server, _ = openmetrics.serve(o.archive, o.bind, o.port, o.profile, o.host)
    line(f"serving http://{o.bind}:{server.server_port}/metrics from {o.archive}/ (Ctrl-C stops)")
    try:
        while True:
            time.sleep(3600)
    finally:
        server.shutdown()
