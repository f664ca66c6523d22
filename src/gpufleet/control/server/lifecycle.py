"""launch / wait / stop / logs across hosts, on top of the agent's server verbs."""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.control.connect.base import Progress, ResumableCall, Session, host_events
from gpufleet.control.connect.cancel import SLICE_S, CancelToken
from gpufleet.control.connect.fanout import FleetResult, HostResult
from gpufleet.control.connect.fleet import Fleet
from gpufleet.control.inventory.model import Host
from gpufleet.control.server.host_options import LaunchOptions
from gpufleet.control.server.profiles import Profile, build_specs
from gpufleet.errors import HostError
from gpufleet.host.agent import runas
from gpufleet.host.agent.childenv import dropped_note
from gpufleet.host.agent.protocol import LaunchArgs, LogsAnswer, LogsArgs, StopArgs, WaitReadyArgs
from gpufleet.kinds import Kind
from gpufleet.readings import LaunchAnswer, StopAnswer, WaitReadyAnswer
from gpufleet.records import HEALTH_TIMEOUT_S, LaunchSpec, ServerState
from gpufleet.report.gpu import dirty_gpus


@dataclass
class Launched:
    """A server up on one host: its state file, how long it took, what preflight warned."""

    state: ServerState
    elapsed_s: float
    warnings: list[str]


def _raise_not_ready(wait: WaitReadyAnswer, dropped: list[str] | None = None) -> None:
    """The server did not become healthy: its phase and reason, and the code-loading
    variables of the login it did not get, which may be why (an LD_LIBRARY_PATH the CUDA
    libraries needed): said here, not at every launch where nothing is wrong."""
    if not wait.ready:
        note = dropped_note(dropped or [])
        said = f"{wait.phase}: {wait.reason}" + (f"; {note}" if note else "")
        raise HostError(said, kind=Kind(wait.phase), tail=wait.tail)


def wait_on(
    session: Session,
    port: int,
    timeout_s: float | None,
    progress: Progress | None,
    *,
    cancel: CancelToken | None = None,
    node_rank: int = 0,
    dropped: list[str] | None = None,
) -> WaitReadyAnswer:
    """Stream wait-ready from the host; the server keeps running if this connection drops.

    With a cancel token the wait runs in slices and raises Cancelled when a stop is asked.
    """
    rank = node_rank
    timeout = timeout_s or HEALTH_TIMEOUT_S
    name = session.host.name
    on_event = host_events(name, progress)

    args = WaitReadyArgs(port=port, timeout_s=timeout, health=rank == 0)
    if cancel is not None:
        args.slice_s = SLICE_S

    def carry_on(answer: WaitReadyAnswer) -> bool:
        args.elapsed_before_s = answer.elapsed_s
        return answer.phase == "waiting"

    resume = f"`inv wait --hosts {name} --port {port}{session.host.cli_hint()}`"
    call = ResumableCall("waiting for the server", resume, timeout + 60)
    wait = session.call_in_slices(args, on_event, call, cancel, carry_on)
    _raise_not_ready(wait, dropped)
    return wait


def launch_on(
    session: Session,
    spec: LaunchSpec,
    options: LaunchOptions,
    progress: Progress | None,
    cancel: CancelToken | None = None,
) -> Launched:
    """Launch one host's server detached and wait until it is healthy, or fail in one line with
    the log's tail."""
    session.hold_steps()
    if options.clean:
        from gpufleet.control.server.gpuclean import (
            CleanOptions,
            clean_on,
            not_clean_error,
            verdict_lines,
        )

        cleaned = clean_on(session, CleanOptions())
        for warn, text in verdict_lines(cleaned.gpus) if progress else []:
            progress(session.host.name, {"warning" if warn else "note": text})  # type: ignore[misc]
        if not cleaned.clean:
            raise not_clean_error(cleaned)
    started = session.call(
        LaunchArgs(
            spec=spec,
            replace=options.replace,
            grace_s=options.grace_s,
            skip_flag_check=options.skip_flag_check,
            allow_unhealthy=options.allow_unhealthy,
            status_hint=f"inv status --hosts {session.host.name}{session.host.cli_hint()}",
        ),
        timeout=600,
    )
    if not started.started or started.state is None:
        raise HostError(
            "preflight refused the launch: " + "; ".join(started.errors), kind=Kind.PREFLIGHT
        )
    if progress:
        for note in started.renames:
            progress(session.host.name, {"note": note})
        for warning in started.warnings:
            progress(session.host.name, {"warning": warning})
        progress(
            session.host.name,
            {"phase": "started", "pid": started.state.pid, "log": started.state.log},
        )
    timeout = options.timeout_s or spec.health_timeout
    wait = wait_on(
        session,
        spec.port,
        timeout,
        progress,
        cancel=cancel,
        node_rank=spec.node_rank,
        dropped=started.dropped_env,
    )
    return Launched(wait.state or started.state, wait.elapsed_s, started.warnings)


def runs_as_root_unasked(host: Host, state: ServerState) -> bool:
    """The server runs as root only because the inventory names no run_as for its host,
    where run_as could be set (never on a rehearsal host or in a Slurm job: runas says)."""
    in_job = host.slurm_job is not None  # srun hosts always have one (their settings)
    return (
        state.user == "root"
        and host.run_as is None
        and runas.cannot_run_as(state.engine, in_job) is None
    )


def run_as_note(hosts: list[str]) -> str:
    """Said once per launch or sweep where servers ran as root for want of run_as (silent
    where the inventory names a user, or says `run_as: root`)."""
    return (
        f"note: the server runs as root on {', '.join(hosts)} (the inventory sets no run_as): "
        "set `run_as: USER` (a local user) for these hosts to run the engine's code "
        "unprivileged; `run_as: root` keeps root and this note away"
    )


def launch(
    fleet: Fleet, profile: Profile, options: LaunchOptions, progress: Progress | None = None
) -> FleetResult[Launched]:
    """Launch the profile's server on every host (each host's own spec)."""
    specs = {host.name: spec for host, spec in build_specs(profile, fleet.hosts, options.engine)}
    return fleet.each(lambda s: launch_on(s, specs[s.host.name], options, progress))


def dry_run(
    fleet: Fleet, profile: Profile, options: LaunchOptions
) -> list[tuple[LaunchSpec, HostResult[LaunchAnswer]]]:
    """Each host's preflight without a launch: the argv that would run there (the engine's
    flag renames on that host applied, secrets hidden), its notes and refusals."""
    specs = {host.name: spec for host, spec in build_specs(profile, fleet.hosts, options.engine)}

    def one(session: Session) -> LaunchAnswer:
        args = LaunchArgs(
            spec=specs[session.host.name],
            skip_flag_check=options.skip_flag_check,
            dry_run=True,
            allow_unhealthy=options.allow_unhealthy,
            status_hint=f"inv status --hosts {session.host.name}{session.host.cli_hint()}",
        )
        return session.call(args, timeout=600)

    results = fleet.each(one)
    for res in results:
        if res.ok and res.value is not None and res.value.errors:
            res.error = "preflight would refuse the launch: " + "; ".join(res.value.errors)
            res.kind = Kind.PREFLIGHT
    return [(specs[res.host.name], res) for res in results]


def wait(
    fleet: Fleet, port: int, timeout_s: float | None, progress: Progress | None = None
) -> FleetResult[WaitReadyAnswer]:
    """Wait on every host until the server on `port` answers healthy."""
    return fleet.each(lambda s: wait_on(s, port, timeout_s, progress))


def stop(fleet: Fleet, args: StopArgs) -> FleetResult[StopAnswer]:
    """Stop the servers `args` names on every host; a host whose GPUs are not clean after
    fails (NOT_CLEAN)."""

    def one(session: Session) -> StopAnswer:
        result: StopAnswer = session.call(args, timeout=args.grace_s + args.timeout_s + 60)
        verify = result.verify
        if verify and not verify.clean:
            dirty = dirty_gpus(verify.gpus)
            raise HostError(
                "server stopped but GPUs are not clean: " + "; ".join(dirty), kind=Kind.NOT_CLEAN
            )
        return result

    return fleet.each(one)


def logs(fleet: Fleet, args: LogsArgs, progress: Progress | None = None) -> FleetResult[LogsAnswer]:
    """The server log's tail on every host (`args.follow`: new lines as events, until
    Ctrl-C)."""
    return fleet.each(lambda s: s.call(args, on_event=host_events(s.host.name, progress)))
