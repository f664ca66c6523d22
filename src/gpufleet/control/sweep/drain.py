"""Slurm's word on a sweep's nodes, read before each cell (issue 51, bullet 4).

A node Slurm drains, or marks down, during a sweep gets no new cell. The policy: the cell
that runs on it when the drain begins finishes (Slurm's own drain waits for running jobs
too; gpufleet reads the state only between cells), then the node is skipped, one line
with Slurm's state and reason, and every cell not done there keeps that reason, which the
sweep's report lists. The sweep goes on on the other nodes; `--resume` runs the skipped
cells once Slurm gives the node back. Nothing waits: a drain for maintenance can last
days, and a sweep that stalled on it would hold every other node idle.
"""

from __future__ import annotations

from gpufleet.control.connect.fleet import Fleet
from gpufleet.control.inventory import slurm
from gpufleet.errors import UserError


def slurm_nodes(fleet: Fleet) -> dict[str, str]:
    """The hosts that are Slurm nodes (a job's, made by a `slurm:` node list in a file or
    on the command line, or marked `slurm_node: true`), by node name (their address)."""
    from_slurm = fleet.source.startswith("slurm:")
    return {h.address: h.name for h in fleet.hosts
            if h.slurm_job or h.slurm_node or from_slurm}  # fmt: skip


def unavailable(fleet: Fleet) -> dict[str, str]:
    """Hosts whose node Slurm has drained, draining or down now, with its state and reason;
    none where no host is a Slurm node, or where sinfo cannot answer (the cell then runs,
    and fails on its own if the node is really gone)."""
    nodes = slurm_nodes(fleet)
    if not nodes:
        return {}
    try:
        states = slurm.unusable_nodes(sorted(nodes))
    except UserError:
        return {}
    return {nodes[node]: why for node, why in states.items() if node in nodes}
