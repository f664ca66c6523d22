"""hosts/*.yaml -> validated Host objects, and `--hosts` selection by names, groups or lists.

An inventory file has `defaults` (applied to every host), `hosts` (name -> fields) and
`groups` (name -> host or group names). Every error names the file and the key path.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from gpufleet.archive.layout import DEFAULT_ROOT, RESERVED
from gpufleet.control.inventory import connections, yamlconfig
from gpufleet.control.inventory.yamlconfig import validate
from gpufleet.errors import UserError
from gpufleet.host.agent.redact import remember, secrets_in
from gpufleet.wire import JsonObject

DEFAULT_FORKS = 32


class SimFault(BaseModel):
    """A health fault the rehearsal NVML reports for one GPU (docs/REHEARSAL.md): each rule
    of the health gate can be shown and tested without breaking real hardware."""

    model_config = ConfigDict(extra="forbid")

    power_limit_w: float | None = Field(default=None, gt=0)
    sm_clock_app_mhz: int | None = Field(default=None, gt=0)  # application/locked clocks
    clock_events: (
        list[Literal["sw_power_cap", "hw_slowdown", "sw_thermal", "hw_thermal", "hw_power_brake"]]
        | None
    ) = None
    temperature_c: int | None = None
    remap_pending: bool | None = None
    remap_failed: bool | None = None
    ecc_uncorrected: int | None = Field(default=None, ge=0)
    ecc: bool | None = None
    ecc_pending: bool | None = None
    xids: list[int] | None = None
    nvlink_down: list[int] | None = None
    pcie_width: int | None = Field(default=None, gt=0)
    pcie_gen: int | None = Field(default=None, gt=0)
    mig: bool | None = None
    mig_pending: bool | None = None
    persistence: bool | None = None
    compute_mode: Literal["default", "exclusive_process", "prohibited"] | None = None


class GpuSpec(BaseModel):
    """What the host should have; `simulated` hosts get gpufleet's rehearsal NVML."""

    model_config = ConfigDict(extra="forbid")

    count: int | None = Field(default=None, ge=0, description="expected GPU count; None = any")
    simulated: bool = False
    model: str = "NVIDIA H200"
    memory_mib: int = Field(default=143771, gt=0)
    reserved_mib: int = Field(default=615, ge=0)
    sim_count: int | None = Field(
        default=None,
        ge=0,
        description="GPUs the simulation has (default: count); rehearses a lost GPU",
    )
    faults: dict[int, SimFault] = Field(
        default_factory=dict, description="simulated hosts: health faults per GPU index"
    )
    boot_id: str | None = Field(
        default=None, description="simulated hosts: the boot id (a new one rehearses a reboot)"
    )


class Host(BaseModel):
    """One GPU host as the control plane sees it: the fields every host has here, and its
    connection's own (`settings`, declared by the connection: control/inventory/connections.py)."""

    model_config = ConfigDict(extra="forbid")

    name: str
    address: str = "localhost"
    # how the host is reached: a name in control/inventory/connections.CONNECTIONS, whose
    # settings model declares and checks the fields it reads (ssh: port, user, keys...)
    connection: str = "ssh"
    slurm_job: str | None = Field(default=None, pattern=r"^\d+(_\d+)?$")
    # a Slurm node (set for every host a `slurm:` node list makes, however the inventory
    # names Slurm): a sweep reads its drain and down states before each cell
    slurm_node: bool = False
    python: str = "python3"
    python_trust: Literal["refuse", "warn"] = "refuse"  # warn: a lab machine's shared venv
    # the local user servers, their ranks and probes run as (root keeps gpu-clean, NVML and
    # the kernel log); absent or `root`: they run as the connecting user (issue 50)
    run_as: str | None = Field(default=None, pattern=r"^[a-z_][a-z0-9_.-]{0,31}\$?$")
    workdir: str = "~/.gpufleet"
    gpus: GpuSpec = Field(default_factory=GpuSpec)
    vars: JsonObject = Field(default_factory=dict)  # the user's own, never read by gpufleet
    settings: connections.Settings | None = None  # last: read by the connection's model

    @model_validator(mode="before")
    @classmethod
    def _connection_fields(cls, data: Any) -> Any:
        """Hand the host's connection the fields it declares (`settings`); drop those only
        another connection declares (defaults shared by hosts reached differently); leave
        any other key to be refused as unknown."""
        if not isinstance(data, dict) or isinstance(data.get("settings"), connections.Settings):
            return data
        data = dict(data)
        if "settings" in data:
            raise ValueError("settings: unknown key")
        entry = connections.CONNECTIONS.get(str(data.get("connection", "ssh")))
        own = set(entry.settings.model_fields) if entry else set()
        fields = {k: v for k, v in data.items() if k in own}
        # the connection's own keys live in its settings alone; another connection's are
        # not this host's (a default for hosts reached otherwise)
        gone = connections.declared_fields() - set(cls.model_fields)
        data = {k: v for k, v in data.items() if k not in gone}
        if entry is not None:
            data["settings"] = fields
        return data

    @field_validator("settings", mode="before")
    @classmethod
    def _by_its_connection(cls, value: Any, info: ValidationInfo) -> Any:
        entry = connections.CONNECTIONS.get(info.data.get("connection", ""))
        if entry is None or isinstance(value, connections.Settings):
            return value
        return entry.settings.model_validate(value)

    def __getattr__(self, name: str) -> Any:
        """A connection's own field reads as the host's (`host.port` of an SSH host)."""
        settings = self.__dict__.get("settings")
        if settings is not None and name in type(settings).model_fields:
            return getattr(settings, name)
        return super().__getattr__(name)  # type: ignore[misc]

    @field_validator("name")
    @classmethod
    def _safe_name(cls, value: str) -> str:
        if not re.match(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,127}$", value):
            raise ValueError(
                "a host name becomes an archive folder: use letters, digits, '.', '_', '@' "
                "and '-', starting with a letter or digit (set `address:` for the real name)"
            )
        if value in RESERVED:
            raise ValueError(
                f"{value!r} is a folder of the archive ({DEFAULT_ROOT}/{value}/): name the host "
                "otherwise and set `address:` for the real name"
            )
        return value

    @field_validator("connection")
    @classmethod
    def _known_connection(cls, value: str) -> str:
        there = connections.names()
        if value not in there:
            named = ", ".join(repr(n) for n in there[:-1])
            raise ValueError(f"Input should be {named} or {there[-1]!r}")
        return value

    @field_validator("python", "workdir", "address")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be empty")
        if "\n" in value or "\0" in value:
            raise ValueError("must be a single line")
        return value

    @property
    def python_path(self) -> str:
        """`auto` on a local host means the control plane's own interpreter."""
        if self.python == "auto":
            return sys.executable
        return self.python

    @property
    def label(self) -> str:
        """How the host is named in output."""
        return self.name

    _inventory: str | None = PrivateAttr(default=None)  # the file this host came from

    def cli_hint(self) -> str:
        """` --inventory FILE` for printed commands, so they work when pasted as they are."""
        return f" --inventory {shlex.quote(self._inventory)}" if self._inventory else ""


class _InventoryFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    defaults: JsonObject = Field(default_factory=dict)  # the YAML, before each host is read
    hosts: dict[str, JsonObject | None] = Field(default_factory=dict)  # the YAML's, likewise
    groups: dict[str, list[str]] = Field(default_factory=dict)
    forks: int = Field(default=DEFAULT_FORKS, ge=1, le=1024)


class Inventory(BaseModel):
    """Hosts and groups as read and checked from one source, with the nodes that source skipped
    and why."""

    source: str
    hosts: dict[str, Host]
    groups: dict[str, list[str]]
    forks: int = DEFAULT_FORKS
    skipped: dict[str, str] = {}  # nodes a node list named that Slurm will not run on: why

    def select(self, spec: str | None) -> list[Host]:
        """Resolve `--hosts`: comma list of host or group names; empty/None/`all` = every host."""
        if spec is None or not spec.strip() or spec.strip() == "all":
            return list(self.hosts.values())
        chosen: list[str] = []
        for raw in spec.split(","):
            name = raw.strip()
            if not name:
                raise UserError(f"--hosts {spec!r}: empty name in the list")
            for host_name in self._expand(name, seen=()):
                if host_name not in chosen:
                    chosen.append(host_name)
        return [self.hosts[n] for n in chosen]

    def _expand(self, name: str, seen: tuple[str, ...]) -> list[str]:
        if name in self.hosts:
            return [name]
        if name in self.groups:
            if name in seen:
                raise UserError(f"{self.source}: groups.{name}: group includes itself")
            out: list[str] = []
            for member in self.groups[name]:
                out.extend(self._expand(member, (*seen, name)))
            return out
        if name in self.skipped:  # a node the source named, which Slurm will not run on now
            raise UserError(f"{name}: Slurm has the node {self.skipped[name]} (in "
                            f"{self.source}): not usable now; run this again once Slurm "
                            "gives it back (scontrol show node " + name + ")")  # fmt: skip
        known = ", ".join(sorted(self.hosts) + sorted(self.groups)) or "none"
        raise UserError(f"unknown host or group {name!r} (in {self.source}: {known})")


def load_inventory(path: str | Path | None = None) -> Inventory:
    """The inventory `path` names (else $GPUFLEET_INVENTORY, else the rehearsal's), read
    by the source that claims it (control/inventory/sources.py), checked."""
    from gpufleet.control.inventory.sources import expand_entries, read_source

    spec = str(path) if path is not None else os.environ.get("GPUFLEET_INVENTORY")
    source, data = read_source(spec)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise UserError(f"{source}: expected a mapping with defaults/hosts/groups at top level")
    raw = validate(_InventoryFile, data, source)
    if not isinstance(raw.defaults, dict):
        raise UserError(f"{source}: defaults: expected a mapping")
    expanded = expand_entries(raw.hosts, source)
    entries = expanded.hosts
    for group, nodes in expanded.groups.items():
        if group in raw.groups:
            raise UserError(f"{source}: groups.{group}: also the group of a node list")
        raw.groups[group] = nodes
    hosts: dict[str, Host] = {}
    for name, fields in entries.items():
        fields = fields or {}
        if not isinstance(fields, dict):
            raise UserError(f"{source}: hosts.{name}: expected a mapping of host fields")
        if "name" in fields:
            raise UserError(f"{source}: hosts.{name}.name: unknown key (the name is the key)")
        merged = yamlconfig.merged(raw.defaults, fields)
        merged["name"] = str(name)
        merged.setdefault("address", str(name))
        hosts[str(name)] = validate(Host, merged, source, prefix=f"hosts.{name}")
        hosts[str(name)]._inventory = source
    for group, members in raw.groups.items():
        if group in hosts:
            raise UserError(f"{source}: groups.{group}: a host has the same name")
        for member in members:
            if member not in hosts and member not in raw.groups:
                raise UserError(f"{source}: groups.{group}: unknown host or group {member!r}")
    remember(secrets_in(data))  # a token in vars never reaches the terminal
    inv = Inventory(
        source=source, hosts=hosts, groups=raw.groups, forks=raw.forks, skipped=expanded.skipped
    )
    for group in raw.groups:
        inv.select(group)  # detects cycles early
    return inv
