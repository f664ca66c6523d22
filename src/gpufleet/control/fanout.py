"""Run one function per host in parallel, bounded like Ansible's forks.

Each host gets its own HostResult; an exception on one host is captured there and never
stops or hides the others. The caller decides the exit code from `any_failed`.
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

from gpufleet.control import sessionpool
from gpufleet.control.cancel import Cancelled
from gpufleet.control.inventory import Host
from gpufleet.control.transport import Session, open_session
from gpufleet.errors import HostError, UserError
from gpufleet.kinds import Kind

T = TypeVar("T")


@dataclass
class HostResult(Generic[T]):
    host: Host
    value: T | None = None
    error: str | None = None
    kind: Kind | None = None
    tail: list[str] = field(default_factory=list)
    reported: bool = False  # already shown to the user as it happened
    warnings: list[str] = field(default_factory=list)  # about the host itself, said once

    @property
    def ok(self) -> bool:
        return self.error is None


def run_on_hosts(
    hosts: Iterable[Host],
    work: Callable[[Session], T],
    forks: int = 32,
    on_done: Callable[[HostResult[T]], None] | None = None,
) -> list[HostResult[T]]:
    """Run `work(session)` on each host's session; results in inventory order.

    Inside a task (sessionpool.for_task) the session stays open for the task's next round;
    outside one it is opened and closed here.

    `on_done` sees each host's result as soon as that host finishes (e.g. to say at once
    that a host was lost, with its resume hint, while the others go on)."""
    hosts = list(hosts)

    pool = sessionpool.current()

    def one(host: Host) -> HostResult[T]:
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
            results[index] = result = one(hosts[index])
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
    return [r for r in results if r is not None]


def any_failed(results: Iterable[HostResult[Any]]) -> bool:
    return any(not r.ok for r in results)
