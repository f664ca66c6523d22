"""Run one function per host in parallel, bounded like Ansible's forks.

Each host gets its own HostResult; an exception on one host is captured there and never
stops or hides the others. The caller decides the exit code from the FleetResult.
Workers are daemon threads: when the user aborts (Ctrl-C), the CLI exits at once instead
of waiting for hosts whose work goes on detached anyway (servers, benchmark runners).
"""

from __future__ import annotations

import queue
import threading
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from gpufleet.control.connect import pool as sessionpool
from gpufleet.control.connect.base import Session
from gpufleet.control.connect.cancel import Cancelled
from gpufleet.control.connect.pool import open_session
from gpufleet.control.inventory.model import Host
from gpufleet.errors import HostError, UserError
from gpufleet.kinds import Kind

T = TypeVar("T")


@dataclass
class HostResult(Generic[T]):
    """One host's outcome: its value, or its error with the kind, the last lines and warnings
    about the host."""

    host: Host
    value: T | None = None
    error: str | None = None
    kind: Kind | None = None
    tail: list[str] = field(default_factory=list)
    reported: bool = False  # already shown to the user as it happened
    warnings: list[str] = field(default_factory=list)  # about the host itself, said once

    @property
    def ok(self) -> bool:
        """No error on this host."""
        return self.error is None


class FleetResult(list[HostResult[T]]):
    """Every host's result in inventory order (Fabric's GroupResult): which failed, the
    exit code a task ends with, and what to say about the failures."""

    @property
    def failed(self) -> list[HostResult[T]]:
        """The hosts that failed, in order."""
        return [r for r in self if not r.ok]

    def exit_code(self) -> int:
        """0 when every host succeeded, else 1."""
        return 1 if self.failed else 0

    def summary(self) -> str:
        """ "N of M host(s) failed", or "" when none did."""
        return f"{len(self.failed)} of {len(self)} host(s) failed" if self.failed else ""

    def report(self, with_tail: bool = False) -> list[str]:
        """Each host's warnings about itself, then `host: FAILED: why` for each failed host
        not already said, with its server log's tail when asked."""
        lines = [f"{r.host.name}: warning: {w}" for r in self for w in r.warnings]
        for res in self.failed:
            if res.reported:
                continue
            lines.append(f"{res.host.name}: FAILED: {res.error}")
            if with_tail and res.tail:
                lines.append(
                    f"--- {res.host.name}: last {len(res.tail)} lines of the server log ---"
                )
                lines += [f"{res.host.name}| {text}" for text in res.tail]
        return lines


def _run_one(host: Host, work: Callable[[Session], T], pool: Any) -> HostResult[T]:
    """`work` on one host's session; whatever goes wrong is kept in its result."""
    session: Session | None = None
    try:
        session = pool.take(host) if pool else open_session(host)
        result = HostResult(host, value=work(session))
    except HostError as exc:
        result = HostResult(host, error=str(exc), kind=exc.kind, tail=exc.tail)
    except Cancelled as exc:
        result = HostResult(host, error=f"interrupted while {exc}", kind=Kind.CANCELLED)
    except UserError as exc:
        result = HostResult(host, error=str(exc), kind=Kind.BAD_INPUT)
    except Exception as exc:  # a bug: keep it on this host, with enough to report it
        detail = traceback.format_exception_only(type(exc), exc)[-1].strip()
        result = HostResult(host, error=f"internal error: {detail}", kind=Kind.CRASH)
    finally:
        if session is not None and pool is not None:
            pool.give_back(session)
        elif session is not None:
            sessionpool.close_quietly(session)
    if session is not None:
        result.warnings = sorted(session.warnings)
    return result


def run_on_hosts(
    hosts: Iterable[Host],
    work: Callable[[Session], T],
    forks: int = 32,
    on_done: Callable[[HostResult[T]], None] | None = None,
) -> FleetResult[T]:
    """Run `work(session)` on each host's session; results in inventory order.

    Inside a task (sessionpool.for_task) the session stays open for the task's next round;
    outside one it is opened and closed here.

    `on_done` sees each host's result as soon as that host finishes (e.g. to say at once
    that a host was lost, with its resume hint, while the others go on)."""
    hosts = list(hosts)
    pool = sessionpool.current()
    results: list[HostResult[T] | None] = [None] * len(hosts)
    todo: queue.SimpleQueue[int] = queue.SimpleQueue()
    for index in range(len(hosts)):
        todo.put(index)

    def worker() -> None:
        while True:
            try:
                index = todo.get_nowait()
            except queue.Empty:
                return
            results[index] = result = _run_one(hosts[index], work, pool)
            if on_done is not None:
                on_done(result)

    threads = [
        threading.Thread(target=worker, name="gpufleet-host", daemon=True)
        for _ in range(max(1, min(forks, len(hosts))))
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()  # interruptible: Ctrl-C reaches the main thread here
    return FleetResult(r for r in results if r is not None)
