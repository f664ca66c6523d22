"""Every way of reaching a host, found by name: an inventory's `connection:` names one entry
of CONNECTIONS. Each connection owns its settings (a frozen dataclass read off the host and
checked where it is read, `settings_of`) and names its Session class (control/connect/),
imported only when a session opens, so loading an inventory never imports paramiko.

Adding a connection: its Session in a module of its own under control/connect/, its
settings class here, and one line in CONNECTIONS (docs/ARCHITECTURE.md, "Where to add").
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Protocol


class Host(Protocol):
    """The fields of an inventory host (control/inventory/model.Host) a connection reads."""

    connection: str
    address: str
    port: int | None
    user: str | None
    identity_file: str | None
    proxy_jump: str | None
    host_key_policy: str
    known_hosts: str | None
    connect_timeout: float
    slurm_job: str | None


@dataclass(frozen=True)
class SshSettings:
    """What an SSH connection reads: where, as whom, with which key, through which jump
    host, trusting which host keys, and how long a connect may take."""

    address: str
    port: int | None
    user: str | None
    identity_file: str | None
    proxy_jump: str | None
    host_key_policy: str
    known_hosts: str | None
    connect_timeout: float

    @classmethod
    def of(cls, host: Host) -> SshSettings:
        """The host's SSH settings."""
        return cls(
            host.address, host.port, host.user, host.identity_file, host.proxy_jump,
            host.host_key_policy, host.known_hosts, host.connect_timeout,
        )  # fmt: skip

    def login(self) -> str:
        """`[-p PORT ]user@address` as `ssh` takes it, for printed hints."""
        where = f"{self.user}@{self.address}" if self.user else self.address
        return (f"-p {self.port} " if self.port else "") + where


@dataclass(frozen=True)
class LocalSettings:
    """A local host: the agent runs here, as this user; nothing to configure."""

    @classmethod
    def of(cls, host: Host) -> LocalSettings:
        """No settings: the control plane's own machine."""
        return cls()


@dataclass(frozen=True)
class SrunSettings:
    """An srun connection: the agent runs as a step of `job` on `node`, no SSH
    (control/connect/srun.py)."""

    job: str
    node: str

    @classmethod
    def of(cls, host: Host) -> SrunSettings:
        """The job and node; a host without a job cannot be reached this way."""
        if host.slurm_job is None:
            raise ValueError(
                "connection: srun needs slurm_job: a running job of yours that holds the "
                "node (or list the nodes as `slurm:job=N`, which sets it)"
            )
        return cls(host.slurm_job, host.address)


@dataclass(frozen=True)
class Connection:
    """One way of reaching a host: its name, its settings, and where its Session lives."""

    name: str
    settings: type[SshSettings] | type[LocalSettings] | type[SrunSettings]
    module: str  # imported when a session opens
    session: str  # the Session class in that module


CONNECTIONS: dict[str, Connection] = {
    c.name: c
    for c in (
        Connection("ssh", SshSettings, "gpufleet.control.connect.ssh", "SSHSession"),
        Connection("local", LocalSettings, "gpufleet.control.connect.local", "LocalSession"),
        Connection("srun", SrunSettings, "gpufleet.control.connect.srun", "SrunSession"),
    )
}
NAMES = tuple(CONNECTIONS)


def settings_of(host: Host) -> SshSettings | LocalSettings | SrunSettings:
    """The host's settings for its connection (ValueError: what is missing)."""
    return CONNECTIONS[host.connection].settings.of(host)


def session_class(host: Host) -> type:
    """The Session class of the host's connection (control/connect/pool.py opens it)."""
    connection = CONNECTIONS[host.connection]
    cls: type = getattr(importlib.import_module(connection.module), connection.session)
    return cls
