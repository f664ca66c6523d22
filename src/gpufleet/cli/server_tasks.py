"""Tasks about servers: profiles, launch, wait, stop, logs."""

from __future__ import annotations

from gpufleet.cli.args import choice, nonzero
from gpufleet.cli.common import finish, select_hosts, task, user_errors
from gpufleet.cli.common_options import (
    DAY,
    PORT_MAX,
    count,
    fleet_options,
    positive_float,
)
from gpufleet.cli.options import Option, OptionSet, Rule, switch
from gpufleet.control.server.engines import NAMES as ENGINE_NAMES
from gpufleet.control.server.host_options import LaunchOptions
from gpufleet.host.agent.protocol import LogsArgs, StopArgs
from gpufleet.records import HEALTH_TIMEOUT_S

LAUNCH = OptionSet(
    LaunchOptions,
    Rule(lambda o: not o.profile, "launch needs --profile NAME (see `inv profiles`)"),
    profile=Option("profile name under playbooks/ (or a YAML path)", short="p", to_request=False),
    dry_run=switch("print the exact argv and environment per host; start nothing", short="n"),
    replace=Option("stop a server already running on the port first", flag_default=False),
    clean=Option("run gpu-clean on the hosts first", flag_default=False),
    engine=Option("override the engine (e.g. sim to rehearse a profile)",
                  choice(*ENGINE_NAMES)),
    timeout=Option("seconds to wait for health", nonzero(positive_float), field="timeout_s",
                   default_text="the profile's health_timeout", most=7 * DAY),
    skip_flag_check=Option("do not check flags against the engine's --help on the host",
                           flag_default=False),
    allow_unhealthy=Option("launch even on a GPU the health check calls bad (recorded)",
                           flag_default=False),
) | fleet_options(LaunchOptions)  # fmt: skip

WAIT = OptionSet(
    profile=Option("take the port from this profile", short="p"),
    port=Option("server port", nonzero(count), default=None, default_text="30000",
                most=PORT_MAX),
    timeout=Option("seconds to wait for health", positive_float, default=HEALTH_TIMEOUT_S,
                   most=7 * DAY),
) | fleet_options()  # fmt: skip

STOP = OptionSet(
    StopArgs,
    profile=Option("only servers of this profile", short="p"),
    port=Option("only the server on this port", nonzero(count), most=PORT_MAX),
    grace=Option("seconds between SIGTERM and SIGKILL", positive_float, field="grace_s",
                 most=3600),
    timeout=Option("seconds to wait for the GPUs to read 0 MiB", positive_float,
                   field="timeout_s", most=7 * DAY),
) | fleet_options(StopArgs)  # fmt: skip

LOGS = OptionSet(
    LogsArgs,
    profile=Option("the latest server of this profile", short="p"),
    port=Option("the server on this port", nonzero(count), most=PORT_MAX),
    lines=Option("how many lines", count, most=1_000_000),
    follow=Option("keep printing new lines (Ctrl-C ends)", flag_default=False, default=False),
) | fleet_options(LogsArgs)  # fmt: skip


@task
@user_errors
def profiles(c):
    """List the server profiles in playbooks/ (resolved through `extends`)."""
    from gpufleet.cli.output import table
    from gpufleet.control.server.profiles import list_profiles
    from gpufleet.errors import UserError

    rows = []
    for item in list_profiles():
        if isinstance(item, UserError):
            rows.append(["?", "-", "-", "-", f"INVALID: {item}"])
            continue
        spec = item.speculative_algorithm or "-"
        rows.append([item.name, item.engine, item.model_path, spec, item.description])
    table("playbooks/", ["profile", "engine", "model", "speculative", "description"], rows)


@LAUNCH.task()
def launch(c, **given):
    """Start the profile's server detached on each host and wait until /health answers 200."""
    from gpufleet.cli.output import line
    from gpufleet.cli.progress import launch_progress
    from gpufleet.control.server import lifecycle
    from gpufleet.control.server.profiles import load_profile

    o = LAUNCH.parse(given)
    prof = load_profile(o.profile)
    fleet = select_hosts(o)
    options = LAUNCH.request(o)
    if o.dry_run:
        _print_dry_run(lifecycle.dry_run(fleet, prof, options))
        return
    results = lifecycle.launch(fleet, prof, options, launch_progress())
    for res in results:
        if res.ok and res.value is not None:
            st = res.value.state
            line(
                f"{res.host.name}: READY {st.profile} pid {st.pid} port {st.port} "
                f"in {res.value.elapsed_s:.1f}s ({st.engine} {st.engine_version})"
            )
    as_root = [r.host.name for r in results if r.ok and r.value is not None
               and lifecycle.runs_as_root_unasked(r.host, r.value.state)]  # fmt: skip
    if as_root:
        line(lifecycle.run_as_note(as_root))
    finish(results, with_tail=True)


def _print_dry_run(checked):
    """`inv launch --dry-run`: the exact argv, environment and log per host."""
    import shlex

    from gpufleet.cli.output import line
    from gpufleet.control.connect.fanout import FleetResult
    from gpufleet.host.agent.childenv import dropped_note
    from gpufleet.host.agent.redact import redact_env

    for spec, res in checked:
        name = res.host.name
        line(f"{name}: engine {spec.engine}, node rank {spec.node_rank}/{spec.nnodes}")
        if res.value is None:
            continue  # unreachable: said below
        line(f"{name}: argv: {shlex.join(res.value.argv)}")
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in redact_env(spec.env).items())
        line(f"{name}: env: {env or '-'}")
        line(f"{name}: log: <workdir>/{spec.log}")
        for note in res.value.renames:
            line(f"{name}: note: {note}")
        for warning in res.value.warnings:
            line(f"{name}: warning: {warning}")
        dropped = dropped_note(res.value.dropped_env)
        if dropped:
            line(f"{name}: note: {dropped}")
    line("dry run: nothing started")
    finish(FleetResult(res for _, res in checked))


@WAIT.task()
def wait(c, **given):
    """Resume waiting for launched servers to become healthy (after a dropped connection)."""
    from gpufleet.cli.output import line
    from gpufleet.cli.progress import launch_progress
    from gpufleet.control.server import lifecycle
    from gpufleet.control.server.profiles import load_profile

    o = WAIT.parse(given)
    port_number = o.port or (load_profile(o.profile).port if o.profile else 30000)
    fleet = select_hosts(o)
    results = lifecycle.wait(fleet, port_number, o.timeout, launch_progress())
    for res in results:
        if res.ok:
            line(f"{res.host.name}: READY port {port_number} ({res.value.elapsed_s:.1f}s)")
    finish(results, with_tail=True)


@STOP.task()
def stop(c, **given):
    """Stop launched servers (process group: SIGTERM, grace, SIGKILL) and verify GPUs clean."""
    from gpufleet.cli.gpu_output import verified_line
    from gpufleet.cli.output import line
    from gpufleet.control.server import lifecycle

    o = STOP.parse(given)
    fleet = select_hosts(o)
    results = lifecycle.stop(fleet, STOP.request(o))
    for res in results:
        if res.ok:
            answer = res.value
            for s in answer.stopped:
                line(f"{res.host.name}: stopped {s.profile} pid {s.pid} port {s.port} ({s.signal})")
            for refusal in answer.refused:
                line(f"{res.host.name}: {refusal}")
            if not answer.stopped and not answer.refused:
                line(f"{res.host.name}: no running server to stop")
            if answer.verify:
                line(f"{res.host.name}: {verified_line(answer.verify)}")
    finish(results)


@LOGS.task()
def logs(c, **given):
    """Show the tail of the remote server log (optionally follow it)."""
    from gpufleet.cli.output import line
    from gpufleet.cli.progress import launch_progress
    from gpufleet.control.server import lifecycle

    o = LOGS.parse(given)
    follow = o.follow
    results = lifecycle.logs(
        select_hosts(o), LOGS.request(o), launch_progress() if follow else None
    )
    for res in results:
        if res.ok and not follow:
            line(f"--- {res.host.name}: {res.value['log']} ---")
            for text in res.value["lines"]:
                line(f"{res.host.name}| {text}")
    finish(results)
