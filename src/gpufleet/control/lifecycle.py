"""launch / wait / stop / logs across hosts, on top of the agent's server verbs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpufleet.control.cancel import SLICE_S, CancelToken
from gpufleet.control.fanout import HostResult, run_on_hosts
from gpufleet.control.inventory import Host
from gpufleet.control.playbook import Profile, build_specs
from gpufleet.control.transport import Session, host_events
from gpufleet.errors import HostError
from gpufleet.host.protocol import LaunchArgs, LogsArgs, StopArgs, WaitReadyArgs
from gpufleet.kinds import Kind
from gpufleet.readings import StopAnswer
from gpufleet.records import HEALTH_TIMEOUT_S, LaunchSpec
from gpufleet.report.gpu import dirty_gpus

Progress = Callable[[str, dict[str, Any]], None]


@dataclass
class LaunchOptions:
    replace: bool = False
    clean: bool = False
    engine: str | None = None
    timeout_s: float | None = None
    skip_flag_check: bool = False
    grace_s: float = 15.0
    allow_unhealthy: bool = False  # launch on a GPU the health check calls bad (recorded)


def _raise_not_ready(wait: dict[str, Any]) -> None:
    if not wait.get("ready"):
        raise HostError(
            f"{wait['phase']}: {wait['reason']}",
            kind=Kind(wait["phase"]),
            tail=wait.get("tail", []),
        )


def wait_on(
    session: Session,
    spec: LaunchSpec | dict[str, Any],
    timeout_s: float | None,
    progress: Progress | None,
    cancel: CancelToken | None = None,
) -> dict[str, Any]:
    """Stream wait-ready from the host; the server keeps running if this connection drops.

    With a cancel token the wait runs in slices and raises Cancelled when a stop is asked.
    """
    port = spec["port"] if isinstance(spec, dict) else spec.port
    rank = spec.get("node_rank", 0) if isinstance(spec, dict) else spec.node_rank
    timeout = timeout_s or (
        spec.health_timeout if isinstance(spec, LaunchSpec) else HEALTH_TIMEOUT_S
    )
    name = session.host.name
    on_event = host_events(name, progress)

    args = WaitReadyArgs(port=port, timeout_s=timeout, health=rank == 0)
    if cancel is not None:
        args.slice_s = SLICE_S
    while True:
        wait = session.call_resumable(
            args,
            on_event,
            timeout + 60,
            doing="waiting for the server",
            resume=f"`inv wait --hosts {name} --port {port}{session.host.cli_hint()}`",
        )
        if wait["phase"] != "waiting":
            break
        args.elapsed_before_s = wait["elapsed_s"]
        cancel.check("waiting for the server")  # type: ignore[union-attr]
    _raise_not_ready(wait)
    return wait


def launch_on(
    session: Session,
    spec: LaunchSpec,
    options: LaunchOptions,
    progress: Progress | None,
    cancel: CancelToken | None = None,
) -> dict[str, Any]:
    if options.clean:
        from gpufleet.control.gpuclean import CleanOptions, clean_on

        cleaned = clean_on(session, CleanOptions())
        if not cleaned.clean:
            raise HostError("gpu-clean before launch did not verify clean", kind=Kind.NOT_CLEAN)
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
    if not started["started"]:
        raise HostError(
            "preflight refused the launch: " + "; ".join(started["errors"]), kind=Kind.PREFLIGHT
        )
    if progress:
        for note in started.get("renames", []):
            progress(session.host.name, {"note": note})
        for warning in started.get("warnings", []):
            progress(session.host.name, {"warning": warning})
        progress(
            session.host.name,
            {"phase": "started", "pid": started["state"]["pid"], "log": started["state"]["log"]},
        )
    wait = wait_on(session, spec, options.timeout_s, progress, cancel)
    return {
        "state": wait["state"],
        "elapsed_s": wait["elapsed_s"],
        "warnings": started.get("warnings", []),
    }


def launch(
    hosts: list[Host],
    profile: Profile,
    options: LaunchOptions,
    forks: int,
    progress: Progress | None = None,
) -> list[HostResult[dict]]:
    specs = {host.name: spec for host, spec in build_specs(profile, hosts, options.engine)}
    return run_on_hosts(
        hosts, lambda s: launch_on(s, specs[s.host.name], options, progress), forks=forks
    )


def dry_run(
    hosts: list[Host], profile: Profile, options: LaunchOptions, forks: int
) -> list[tuple[LaunchSpec, HostResult[dict]]]:
    """Each host's preflight without a launch: the argv that would run there (the engine's
    flag renames on that host applied, secrets hidden), its notes and refusals."""
    specs = {host.name: spec for host, spec in build_specs(profile, hosts, options.engine)}

    def one(session: Session) -> dict[str, Any]:
        args = LaunchArgs(
            spec=specs[session.host.name],
            skip_flag_check=options.skip_flag_check,
            dry_run=True,
            allow_unhealthy=options.allow_unhealthy,
            status_hint=f"inv status --hosts {session.host.name}{session.host.cli_hint()}",
        )
        return session.call(args, timeout=600)

    results = run_on_hosts(hosts, one, forks=forks)
    for res in results:
        if res.ok and res.value["errors"]:
            res.error = "preflight would refuse the launch: " + "; ".join(res.value["errors"])
            res.kind = Kind.PREFLIGHT
    return [(specs[res.host.name], res) for res in results]


def wait(
    hosts: list[Host],
    port: int,
    timeout_s: float | None,
    forks: int,
    progress: Progress | None = None,
) -> list[HostResult[dict]]:
    spec = {"port": port, "node_rank": 0}
    return run_on_hosts(hosts, lambda s: wait_on(s, spec, timeout_s, progress), forks=forks)


def stop(
    hosts: list[Host],
    profile: str | None,
    port: int | None,
    grace_s: float,
    timeout_s: float,
    forks: int,
) -> list[HostResult[StopAnswer]]:
    def one(session: Session) -> StopAnswer:
        result: StopAnswer = session.call(
            StopArgs(profile=profile, port=port, grace_s=grace_s, timeout_s=timeout_s),
            timeout=grace_s + timeout_s + 60,
        )
        verify = result.verify
        if verify and not verify.clean:
            dirty = dirty_gpus(verify.gpus)
            raise HostError(
                "server stopped but GPUs are not clean: " + "; ".join(dirty), kind=Kind.NOT_CLEAN
            )
        return result

    return run_on_hosts(hosts, one, forks=forks)


def logs(
    hosts: list[Host],
    profile: str | None,
    port: int | None,
    lines: int,
    follow: bool,
    forks: int,
    progress: Progress | None = None,
) -> list[HostResult[dict]]:
    args = LogsArgs(profile=profile, port=port, lines=lines, follow=follow)
    return run_on_hosts(
        hosts,
        lambda s: s.call(args, on_event=host_events(s.host.name, progress)),
        forks=forks,
    )
