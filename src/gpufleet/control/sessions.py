"""A host's session by its `connection:` (ssh, local, srun), the one place that chooses."""

from __future__ import annotations

from gpufleet.control.inventory import Host
from gpufleet.control.transport import LocalSession, Session, SSHSession


def open_session(host: Host) -> Session:
    if host.connection == "local":
        return LocalSession(host)
    if host.connection == "srun":
        from gpufleet.control.srun import SrunSession

        return SrunSession(host)
    return SSHSession(host)
