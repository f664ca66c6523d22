"""The one seam through which the rehearsal engine plugs into the agent (issue 66): host/
never imports sim/. The zipapp's start-up (its `__main__`, written by
control/agent/bundle.py) installs `gpufleet.sim.provider`; the host code asks `provider()`
when a verb carries simulated GPUs. An agent started without it (`python -m gpufleet.host`)
refuses a simulated verb in one line. Standard library only: this module ships.
"""

from __future__ import annotations

from typing import Protocol

from gpufleet.host.agent.protocol import AgentError, SimGpus
from gpufleet.kinds import Kind


class Simulation(Protocol):
    """What the agent needs of the rehearsal engine."""

    def activate(self, sim: SimGpus, host: str) -> None:
        """Make `import pynvml` (here and in the children started after) read the
        simulated GPUs of `sim`, creating their state when missing."""

    def host_pids(self, state_dir: str) -> set[int]:
        """The processes that joined this simulated host (several share one machine)."""

    def shim_dir(self) -> str:
        """The folder whose `pynvml` is the simulated one, for children's sys.path."""

    def import_root(self) -> str:
        """The path that makes `gpufleet.sim.server` importable (the zip, or src/)."""


_INSTALLED: list[Simulation] = []


def install(simulation: Simulation) -> None:
    """Plug the rehearsal engine in (once, at start-up)."""
    _INSTALLED[:] = [simulation]


def installed() -> Simulation | None:
    return _INSTALLED[0] if _INSTALLED else None


def provider() -> Simulation:
    """The installed rehearsal engine; one line where a simulated verb reaches an agent
    started without it."""
    if not _INSTALLED:
        raise AgentError(
            "this agent was started without the rehearsal engine (run the zip gpufleet "
            "ships): it cannot read simulated GPUs",
            kind=Kind.BAD_INPUT,
        )
    return _INSTALLED[0]
