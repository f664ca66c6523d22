"""Every way of reaching a host, found by name: an inventory's `connection:` names one entry
of CONNECTIONS. Each connection declares its settings model: the fields of a host it reads,
with their checks, validated by the inventory as the host is read (a key no connection
declares is an unknown key), and what the rest of gpufleet asks of it (`describe` for
`inv hosts`, `verb_fields` for the agent's verbs). Its Session class (control/connect/) is
imported only when a session opens, so loading an inventory never imports paramiko.

Adding a connection: its settings model and Session in a module of its own under
control/connect/, and one line in CONNECTIONS (docs/ARCHITECTURE.md, "Where to add").
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Settings(BaseModel):
    """A connection's own fields of an inventory host, declared once: the inventory checks
    a host's fields against them, its Session reads them, and the rest of gpufleet asks
    them what it needs instead of asking which connection it is."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @classmethod
    def of(cls, host: Any) -> Self:
        """The host's settings, which must be this connection's."""
        settings = host.settings
        if not isinstance(settings, cls):
            raise TypeError(f"{host.name}: connection {host.connection}, not {cls.__name__}")
        return settings

    def describe(self) -> str:
        """Where the host is reached, as `inv hosts` lists it."""
        raise NotImplementedError

    def verb_fields(self) -> dict[str, str]:
        """Fields of the agent's verb arguments this connection sets on every call."""
        return {}


class SshSettings(Settings):
    """What an SSH connection reads: where, as whom, with which key, through which jump
    host, trusting which host keys, and how long a connect may take."""

    address: str = "localhost"
    port: int | None = Field(default=None, ge=1, le=65535)
    user: str | None = None
    identity_file: str | None = None
    proxy_jump: str | None = None  # "[user@]bastion[:port]", as ssh -J (keys checked too)
    host_key_policy: Literal["strict", "accept-new"] = "strict"
    known_hosts: str | None = None
    connect_timeout: float = Field(default=10.0, gt=0)

    def login(self) -> str:
        """`[-p PORT ]user@address` as `ssh` takes it, for printed hints."""
        where = f"{self.user}@{self.address}" if self.user else self.address
        return (f"-p {self.port} " if self.port else "") + where

    def describe(self) -> str:
        """`user@address:port`."""
        return f"{self.user or ''}@{self.address}:{self.port or 22}"


class LocalSettings(Settings):
    """A local host: the agent runs here, as this user; nothing to configure."""

    def describe(self) -> str:
        """This machine."""
        return "local"


class SrunSettings(Settings):
    """An srun connection: the agent runs as a step of the host's `slurm_job` on the node
    its address names, no SSH (control/connect/srun.py)."""

    address: str = "localhost"
    slurm_job: str | None = None

    @model_validator(mode="after")
    def _needs_a_job(self) -> Self:
        if self.slurm_job is None:
            raise ValueError(
                "connection: srun needs slurm_job: a running job of yours that holds the "
                "node (or list the nodes as `slurm:job=N`, which sets it)"
            )
        return self

    @property
    def job(self) -> str:
        """The Slurm job the steps run in."""
        assert self.slurm_job is not None  # checked above
        return self.slurm_job

    @property
    def node(self) -> str:
        """The node the steps run on: the host's address."""
        return self.address

    def describe(self) -> str:
        """The job and the node."""
        return f"srun: job {self.job} on {self.node}"

    def verb_fields(self) -> dict[str, str]:
        """The job step the agent's servers and runs belong to."""
        return {"slurm_job": self.job, "slurm_node": self.node}


@dataclass(frozen=True)
class Connection:
    """One way of reaching a host: its name, its settings model, and where its Session
    lives."""

    name: str
    settings: type[Settings]
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


def names() -> tuple[str, ...]:
    """The connections there are, as the registry has them now."""
    return tuple(CONNECTIONS)


def declared_fields() -> set[str]:
    """Every host field some connection declares."""
    return {name for c in CONNECTIONS.values() for name in c.settings.model_fields}


def settings_of(host: Any) -> Settings:
    """The host's settings for its connection, as the inventory checked them."""
    settings: Settings = host.settings
    return settings


def session_class(host: Any) -> type:
    """The Session class of the host's connection (control/connect/pool.py opens it)."""
    connection = CONNECTIONS[host.connection]
    cls: type = getattr(importlib.import_module(connection.module), connection.session)
    return cls
