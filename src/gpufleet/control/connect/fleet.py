"""The hosts a task acts on as one value (Fabric's Group, with gpufleet's forks bound, error
kinds and session pool): `fleet.each(work)` runs `work(session)` on every host, at most
`forks` at once, and `fleet.call(args)` sends one agent verb to every host; both return a
FleetResult (control/connect/fanout.py) with `.failed`, `.exit_code()` and `.report()`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from gpufleet.control.connect.base import Session
from gpufleet.control.connect.fanout import FleetResult, HostResult, run_on_hosts
from gpufleet.control.inventory.model import DEFAULT_FORKS, Host

T = TypeVar("T")


@dataclass(frozen=True)
class Fleet:
    """The hosts a task acts on, with the forks that bound its parallelism and the inventory they
    came from (for pasteable hints)."""

    hosts: list[Host]
    forks: int = DEFAULT_FORKS
    source: str = ""  # the inventory they came from, for pasteable hints
    listed: frozenset[str] = frozenset()  # every host that inventory names
    skipped: tuple[tuple[str, str], ...] = ()  # nodes it left out, and why (drained, down)

    def absent_why(self, name: str) -> str:
        """Why a host is not among these: what the inventory said of it, else that it was
        not selected, else that the inventory lacks it."""
        said = dict(self.skipped).get(name)
        if said:
            return said
        if name in self.listed:
            return "not selected (--hosts)"
        return f"not in {self.source or 'the inventory'}"

    @property
    def names(self) -> list[str]:
        """The hosts' names, in order."""
        return [h.name for h in self.hosts]

    def only(self, names: Iterable[str]) -> Fleet:
        """The hosts among these names (a resumed sweep keeps its own hosts)."""
        keep = set(names)
        return replace(self, hosts=[h for h in self.hosts if h.name in keep])

    def each(
        self,
        work: Callable[[Session], T],
        on_done: Callable[[HostResult[T]], None] | None = None,
    ) -> FleetResult[T]:
        """Run `work` on every host's session, at most `forks` at once; one host's failure never
        hides another's result."""
        return run_on_hosts(self.hosts, work, self.forks, on_done)

    def call(self, args: Any) -> FleetResult[Any]:
        """One agent verb (host/agent/protocol.py's VerbArgs) on every host; its answers."""
        return self.each(lambda session: session.call(args))
