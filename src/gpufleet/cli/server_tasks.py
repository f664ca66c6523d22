"""Tasks about servers: profiles, launch, wait, stop, logs."""

from __future__ import annotations

from gpufleet.cli.common import (
    FLEET_HELP,
    HOSTS_HELP,
    INVENTORY_HELP,
    finish,
    forks_for,
    select_hosts,
    task,
    user_errors,
)
from gpufleet.cli.options import logs_options, stop_options
from gpufleet.records import HEALTH_TIMEOUT_S  # stdlib-only: --list stays fast


@task
@user_errors
def profiles(c):
    """List the server profiles in playbooks/ (resolved through `extends`)."""
    from gpufleet.cli.output import table
    from gpufleet.control.playbook import list_profiles
    from gpufleet.errors import UserError

    rows = []
    for item in list_profiles():
        if isinstance(item, UserError):
            rows.append(["?", "-", "-", "-", f"INVALID: {item}"])
            continue
        spec = item.speculative_algorithm or "-"
        rows.append([item.name, item.engine, item.model_path, spec, item.description])
    table("playbooks/", ["profile", "engine", "model", "speculative", "description"], rows)


@task(
    help={
        "profile": "profile name under playbooks/ (or a YAML path)",
        "hosts": HOSTS_HELP,
        "inventory": INVENTORY_HELP,
        "dry-run": "print the exact argv and environment per host; start nothing",
        "replace": "stop a server already running on the port first",
        "clean": "run gpu-clean on the hosts first",
        "engine": "override the engine (e.g. sim to rehearse a profile)",
        "timeout": "seconds to wait for health (default: the profile's health_timeout)",
        "skip-flag-check": "do not check flags against the engine's --help on the host",
        "allow-unhealthy": "launch even on a GPU the health check calls bad (recorded)",
        "forks": "hosts handled in parallel",
    }
)
@user_errors
def launch(
    c,
    profile=None,
    hosts=None,
    inventory=None,
    dry_run=False,
    replace=False,
    clean=False,
    engine=None,
    timeout=None,
    skip_flag_check=False,
    allow_unhealthy=False,
    forks=None,
):
    """Start the profile's server detached on each host and wait until /health answers 200."""
    import shlex

    from gpufleet.cli.args import positive_float
    from gpufleet.cli.output import line
    from gpufleet.cli.progress import launch_progress
    from gpufleet.control import lifecycle
    from gpufleet.control.playbook import load_profile
    from gpufleet.errors import UserError
    from gpufleet.host.redact import redact_env

    if not profile:
        raise UserError("launch needs --profile NAME (see `inv profiles`)")
    if engine not in (None, "sglang", "sim", "custom"):
        raise UserError(f"--engine {engine!r}: expected sglang, sim or custom")
    prof = load_profile(profile)
    inv, selected = select_hosts(inventory, hosts)
    options = lifecycle.LaunchOptions(
        replace=replace,
        clean=clean,
        engine=engine,
        skip_flag_check=skip_flag_check,
        timeout_s=positive_float(timeout, "--timeout", 0) or None,
        allow_unhealthy=allow_unhealthy,
    )
    if dry_run:
        checked = lifecycle.dry_run(selected, prof, options, forks_for(inv, forks))
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
        finish([res for _, res in checked])
        return
    results = lifecycle.launch(selected, prof, options, forks_for(inv, forks), launch_progress())
    for res in results:
        if res.ok and res.value is not None:
            st = res.value.state
            line(
                f"{res.host.name}: READY {st.profile} pid {st.pid} port {st.port} "
                f"in {res.value.elapsed_s:.1f}s ({st.engine} {st.engine_version})"
            )
    finish(results, with_tail=True)


@task(
    help={
        **FLEET_HELP,
        "profile": "take the port from this profile",
        "port": "server port (default 30000)",
        "timeout": f"seconds to wait for health (default {HEALTH_TIMEOUT_S:g})",
    }
)
@user_errors
def wait(c, hosts=None, inventory=None, profile=None, port=None, timeout=None, forks=None):
    """Resume waiting for launched servers to become healthy (after a dropped connection)."""
    from gpufleet.cli.args import non_negative_int, positive_float
    from gpufleet.cli.output import line
    from gpufleet.cli.progress import launch_progress
    from gpufleet.control import lifecycle
    from gpufleet.control.playbook import load_profile

    port_number = non_negative_int(port, "--port", 0) or (
        load_profile(profile).port if profile else 30000
    )
    inv, selected = select_hosts(inventory, hosts)
    results = lifecycle.wait(
        selected,
        port_number,
        positive_float(timeout, "--timeout", HEALTH_TIMEOUT_S),
        forks_for(inv, forks),
        launch_progress(),
    )
    for res in results:
        if res.ok:
            line(f"{res.host.name}: READY port {port_number} ({res.value.elapsed_s:.1f}s)")
    finish(results, with_tail=True)


STOP = stop_options()


@STOP.task()
def stop(c, **given):
    """Stop launched servers (process group: SIGTERM, grace, SIGKILL) and verify GPUs clean."""
    from gpufleet.cli.output import line
    from gpufleet.control import lifecycle

    o = STOP.parse(given)
    inv, selected = select_hosts(o["inventory"], o["hosts"])
    results = lifecycle.stop(
        selected, o["profile"], o["port"], o["grace"], o["timeout"], forks_for(inv, o["forks"])
    )
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


LOGS = logs_options()


@LOGS.task()
def logs(c, **given):
    """Show the tail of the remote server log (optionally follow it)."""
    from gpufleet.cli.output import line
    from gpufleet.cli.progress import launch_progress
    from gpufleet.control import lifecycle

    o = LOGS.parse(given)
    follow = o["follow"]
    inv, selected = select_hosts(o["inventory"], o["hosts"])
    results = lifecycle.logs(
        selected, o["profile"], o["port"], o["lines"], follow, forks_for(inv, o["forks"]),
        launch_progress() if follow else None,
    )  # fmt: skip
    for res in results:
        if res.ok and not follow:
            line(f"--- {res.host.name}: {res.value['log']} ---")
            for text in res.value["lines"]:
                line(f"{res.host.name}| {text}")
    finish(results)
