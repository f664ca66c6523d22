"""The rehearsal engine as the agent's simulation provider (host/agent/simulation.py): the
simulated NVML, the simulated host's processes, the shim folder and the import root. The
zipapp's start-up installs it; nothing under host/ imports this package."""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

from gpufleet.host.agent import simulation
from gpufleet.host.agent.protocol import SimGpus


class Rehearsal:
    """gpufleet.sim behind the agent's seam."""

    def activate(self, sim: SimGpus, host: str) -> None:
        from gpufleet.sim import gpustate

        state = os.path.abspath(sim["state_dir"])
        sim["state_dir"] = state
        gpustate.ensure_topology(
            state,
            count=sim["count"],
            model=sim.get("model", "NVIDIA H200"),
            memory_mib=sim.get("memory_mib", 143771),
            reserved_mib=sim.get("reserved_mib", 615),
            host=host,
            faults=sim.get("faults"),
            boot_id=sim.get("boot_id"),
        )
        os.environ[gpustate.STATE_ENV] = state
        shim = self.shim_dir()
        if shim not in sys.path:  # for children that import gpufleet from the zip's path
            sys.path.insert(0, shim)
        # the agent's own `import pynvml` would find the zip's vendored binding first (its
        # importer comes before sys.path): the simulated one is put in its place
        sys.modules["pynvml"] = importlib.import_module("gpufleet.sim.nvml_sim")

    def host_pids(self, state_dir: str) -> set[int]:
        from gpufleet.sim import gpustate

        return gpustate.host_pids(state_dir)

    def shim_dir(self) -> str:
        """Works from a zipapp and from an installed package."""
        return str(Path(__file__).resolve().parent / "shim")

    def import_root(self) -> str:
        return str(Path(__file__).resolve().parents[2])


def install() -> None:
    simulation.install(Rehearsal())
