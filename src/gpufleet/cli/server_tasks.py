"""Tasks about servers: profiles, launch, wait, stop, logs."""

from __future__ import annotations

from gpufleet.cli.common import finish, select_hosts, task, user_errors
from gpufleet.cli.tasksets import LAUNCH, LOGS, STOP, WAIT


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
    finish(results, with_tail=True)


def _print_dry_run(checked):
    """`inv launch --dry-run`: the exact argv, environment and log per host."""
    import shlex

    from gpufleet.cli.output import line
    from gpufleet.control.connect.fanout import FleetResult
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
                gpus = ",".join(str(g.index) for g in answer.verify.gpus)
                line(
                    f"{res.host.name}: GPUs {gpus} verified clean in {answer.verify.elapsed_s:.2f}s"
                )
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
