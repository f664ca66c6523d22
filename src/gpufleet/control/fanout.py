"""Run one function per host in parallel, bounded like Ansible's forks.

Each host gets its own HostResult; an exception on one host is captured there and never
stops or hides the others. The caller decides the exit code from `any_failed`.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from gpufleet.control.inventory import Host
from gpufleet.control.transport import Session, open_session
from gpufleet.errors import HostError, UserError

T = TypeVar("T")


@dataclass
class HostResult(Generic[T]):
    host: Host
    value: T | None = None
    error: str | None = None
    kind: str | None = None
    tail: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.error is None


def run_on_hosts(
    hosts: Iterable[Host],
    work: Callable[[Session], T],
    forks: int = 32,
) -> list[HostResult[T]]:
    """Open a session per host, run `work(session)`, close it; results in inventory order."""
    hosts = list(hosts)

    def one(host: Host) -> HostResult[T]:
        session: Session | None = None
        try:
            session = open_session(host)
            return HostResult(host, value=work(session))
        except HostError as exc:
            return HostResult(host, error=str(exc), kind=exc.kind, tail=exc.tail)
        except UserError as exc:
            return HostResult(host, error=str(exc), kind="bad_input")
        except Exception as exc:  # a bug: keep it on this host, with enough to report it
            detail = traceback.format_exception_only(type(exc), exc)[-1].strip()
            return HostResult(host, error=f"internal error: {detail}", kind="crash")
        finally:
            if session is not None:
                try:
                    session.close()
                except Exception:
                    pass

    if not hosts:
        return []
    with ThreadPoolExecutor(max_workers=max(1, min(forks, len(hosts)))) as pool:
        return list(pool.map(one, hosts))


def any_failed(results: Iterable[HostResult[Any]]) -> bool:
    return any(not r.ok for r in results)
