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

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator

from gpufleet.archive.layout import RESERVED
from gpufleet.control import hostlist
from gpufleet.control.yamlconfig import read_yaml, validate
from gpufleet.errors import UserError
from gpufleet.host import trust
from gpufleet.host.redact import remember, secrets_in
from gpufleet.wire import JsonObject

DEFAULT_INVENTORY = Path("hosts/rehearsal.yaml")
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
    """One GPU host as the control plane sees it."""

    model_config = ConfigDict(extra="forbid")

    name: str
    address: str = "localhost"
    port: int | None = Field(default=None, ge=1, le=65535)
    user: str | None = None
    identity_file: str | None = None
    connection: Literal["ssh", "local"] = "ssh"
    python: str = "python3"
    python_trust: Literal["refuse", "warn"] = "refuse"  # warn: a lab machine's shared venv
    workdir: str = "~/.gpufleet"
    gpus: GpuSpec = Field(default_factory=GpuSpec)
    host_key_policy: Literal["strict", "accept-new"] = "strict"
    known_hosts: str | None = None
    connect_timeout: float = Field(default=10.0, gt=0)
    proxy_jump: str | None = None  # "[user@]bastion[:port]", as ssh -J (keys checked too)
    vars: JsonObject = Field(default_factory=dict)

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
                f"{value!r} is a folder of the archive (logs/{value}/): name the host otherwise "
                "and set `address:` for the real name"
            )
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
        return self.name

    _inventory: str | None = PrivateAttr(default=None)  # the file this host came from

    def cli_hint(self) -> str:
        """` --inventory FILE` for printed commands, so they work when pasted as they are."""
        return f" --inventory {shlex.quote(self._inventory)}" if self._inventory else ""


class _InventoryFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    defaults: JsonObject = Field(default_factory=dict)
    hosts: dict[str, JsonObject | None] = Field(default_factory=dict)
    groups: dict[str, list[str]] = Field(default_factory=dict)
    forks: int = Field(default=DEFAULT_FORKS, ge=1, le=1024)


class Inventory(BaseModel):
    source: str
    hosts: dict[str, Host]
    groups: dict[str, list[str]]
    forks: int = DEFAULT_FORKS

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
        known = ", ".join(sorted(self.hosts) + sorted(self.groups)) or "none"
        raise UserError(f"unknown host or group {name!r} (in {self.source}: {known})")


def _merge(base: JsonObject, override: JsonObject) -> JsonObject:
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


SLURM_PREFIX = "slurm:"


def _slurm_nodes(spec: str, where: str) -> list[str]:
    """`gpu[01-16,20]`, `job=123456` or `partition=h200` -> node names."""
    if spec.startswith("job="):
        return hostlist.job_nodes(spec[4:])
    if spec.startswith("partition="):
        return hostlist.partition_nodes(spec[len("partition=") :])
    try:
        return hostlist.expand(spec)
    except UserError as exc:
        raise UserError(f"{where}: {exc}") from None


def _expand_entries(raw_hosts: JsonObject, source: str) -> tuple[JsonObject, dict]:
    """Host entries with Slurm node lists expanded: a key `gpu[01-04]`, `slurm:job=N` or
    `slurm:partition=P` is one entry per node, each with the entry's fields (its address is
    the node name); `group: NAME` in such an entry makes the nodes a group."""
    hosts: JsonObject = {}
    groups: dict[str, list[str]] = {}
    for key, fields in raw_hosts.items():
        key = str(key)
        spec = key[len(SLURM_PREFIX) :] if key.startswith(SLURM_PREFIX) else key
        if "[" not in spec and not key.startswith(SLURM_PREFIX):
            hosts[key] = fields
            continue
        fields = dict(fields or {})
        if "address" in fields:
            raise UserError(f"{source}: hosts.{key}.address: a node list's address is each "
                            "node's name (set it per host instead)")  # fmt: skip
        group = fields.pop("group", None)
        nodes = _slurm_nodes(spec, source if source == key else f"{source}: hosts.{key}")
        for node in nodes:
            if node in hosts:
                raise UserError(f"{source}: hosts.{key}: {node} is listed twice")
            hosts[node] = fields
        if group:
            groups[str(group)] = nodes
    return hosts, groups


def _run_inventory_program(file: Path) -> Any:
    """An executable inventory (as Ansible's): run it, read its JSON or YAML output.

    It runs as whoever runs gpufleet (often root), so it runs only when the trust rule
    passes it: the program and every directory on its way are this user's or root's and
    nobody else can write them.
    """
    import subprocess

    import yaml

    try:
        real = trust.judge(str(file.absolute()), os.geteuid(), trust.FILE, "inventory program")
    except trust.Untrusted as exc:
        raise UserError(f"refusing to run {exc}") from None
    try:
        done = subprocess.run([real], capture_output=True, text=True, timeout=60, check=False)
    except subprocess.TimeoutExpired:
        raise UserError(f"inventory program {file}: no answer in 60 s") from None
    except OSError as exc:
        raise UserError(f"inventory program {file}: cannot run it ({exc.strerror})") from None
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no output on stderr"])[-1]
        raise UserError(f"inventory program {file} exited {done.returncode}: {tail}")
    try:
        return yaml.safe_load(done.stdout)  # JSON is YAML
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        at = f" (line {where.line + 1})" if where else ""
        raise UserError(f"inventory program {file}: its output is not JSON or YAML{at}") from None


def _is_program(file: Path) -> bool:
    return (
        file.is_file()
        and os.access(file, os.X_OK)
        and not file.name.endswith((".yaml", ".yml", ".json"))
    )


def resolve_inventory_path(path: str | None) -> Path:
    """`--inventory` value, else $GPUFLEET_INVENTORY, else hosts/rehearsal.yaml.

    A bare name (no `/`) means `hosts/NAME.yaml`, then `hosts/NAME`: never a file of the
    current directory, which may be anyone's (`-i fleet` typed in /tmp must not run
    /tmp/fleet). `./NAME` or a path with a `/` names a file where it is.
    """
    raw = path or os.environ.get("GPUFLEET_INVENTORY") or str(DEFAULT_INVENTORY)
    if "/" in raw or raw.startswith("~"):
        candidates = [Path(raw).expanduser()]
    else:
        yaml_name = raw if raw.endswith((".yaml", ".yml", ".json")) else f"{raw}.yaml"
        candidates = list(dict.fromkeys([Path("hosts") / yaml_name, Path("hosts") / raw]))
    for candidate in candidates:
        if candidate.exists():
            return candidate
    looked = ", ".join(str(c) for c in candidates)
    here = f"; ./{raw} is in this directory: pass ./{raw} to use it" if Path(raw).exists() else ""
    raise UserError(
        f"inventory {raw!r} not found (looked for {looked}){here}; pass --inventory FILE "
        "or set GPUFLEET_INVENTORY"
    )


def load_inventory(path: str | Path | None = None) -> Inventory:
    raw_path = str(path) if path is not None else os.environ.get("GPUFLEET_INVENTORY")
    if raw_path and raw_path.startswith(SLURM_PREFIX):
        source = raw_path
        data: Any = {"hosts": {raw_path: {"group": "slurm"}}}
    else:
        file = resolve_inventory_path(raw_path)
        source = str(file)
        data = _run_inventory_program(file) if _is_program(file) else read_yaml(file)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise UserError(f"{source}: expected a mapping with defaults/hosts/groups at top level")
    raw = validate(_InventoryFile, data, source)
    if not isinstance(raw.defaults, dict):
        raise UserError(f"{source}: defaults: expected a mapping")
    entries, node_groups = _expand_entries(raw.hosts, source)
    for group, nodes in node_groups.items():
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
        merged = _merge(raw.defaults, fields)
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
    inv = Inventory(source=source, hosts=hosts, groups=raw.groups, forks=raw.forks)
    for group in raw.groups:
        inv.select(group)  # detects cycles early
    return inv
