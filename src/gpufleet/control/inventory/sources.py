"""Where an inventory comes from, behind one protocol (as pyinfra's connectors): a source
claims an `--inventory` value and reads it into the inventory mapping (defaults, hosts,
groups); a node list claims a host key and names its nodes.

    sources:    slurm:SPEC (a Slurm job, partition or node list), an executable program
                (as Ansible's), a YAML or JSON file
    node lists: slurm:job=N, slurm:partition=P, a bracket list gpu[01-16,20]

To add an inventory source: one class with `claims` and `read`, put in SOURCES before the
file source (which claims whatever is left); a node list: one NodeList in NODE_LISTS.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from gpufleet.control.inventory import hostlist, slurm
from gpufleet.control.inventory.yamlconfig import read_yaml
from gpufleet.errors import UserError
from gpufleet.host.agent import trust
from gpufleet.wire import JsonObject

SLURM_PREFIX = "slurm:"
DEFAULT_INVENTORY = Path("hosts/rehearsal.yaml")


class Source(Protocol):
    """Where an inventory comes from: a file, a program, or Slurm."""

    def claims(self, spec: str) -> bool:
        """Whether this source reads `--inventory spec`."""

    def read(self, spec: str) -> tuple[str, Any]:
        """(the source's name for messages and hints, the inventory mapping as read)."""


class SlurmSource:
    """`--inventory slurm:job=N` (or partition=P, or a node list): every node a host of the
    group `slurm`, with the defaults of a host."""

    def claims(self, spec: str) -> bool:
        """`slurm:...` specs (a job, a partition, a host list)."""
        return spec.startswith(SLURM_PREFIX)

    def read(self, spec: str) -> tuple[str, Any]:
        """One node-list entry in the group `slurm`, expanded later with Slurm's answer."""
        return spec, {"hosts": {spec: {"group": "slurm"}}}


class ProgramSource:
    """An executable inventory (as Ansible's): run it, read its JSON or YAML output.

    It runs as whoever runs gpufleet (often root), so it runs only when the trust rule
    passes it: the program and every directory on its way are this user's or root's and
    nobody else can write them."""

    def claims(self, spec: str) -> bool:
        """An executable file without a .yaml/.json name, as Ansible's dynamic inventories."""
        file = resolve_inventory_path(spec)
        return (
            file.is_file()
            and os.access(file, os.X_OK)
            and not file.name.endswith((".yaml", ".yml", ".json"))
        )

    def read(self, spec: str) -> tuple[str, Any]:
        """Run the judged program (60 s at most) and read its JSON or YAML output."""
        import subprocess

        import yaml

        file = resolve_inventory_path(spec)
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
            return str(file), yaml.safe_load(done.stdout)  # JSON is YAML
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            at = f" (line {mark.line + 1})" if mark else ""
            raise UserError(
                f"inventory program {file}: its output is not JSON or YAML{at}"
            ) from None


class FileSource:
    """A YAML (or JSON) inventory file: claims whatever the others leave."""

    def claims(self, spec: str) -> bool:
        """Anything else: a YAML or JSON file."""
        return True

    def read(self, spec: str) -> tuple[str, Any]:
        """The file's mapping, read strictly (duplicate keys refused)."""
        file = resolve_inventory_path(spec)
        return str(file), read_yaml(file)


SOURCES: tuple[Source, ...] = (SlurmSource(), ProgramSource(), FileSource())


def read_source(spec: str | None) -> tuple[str, Any]:
    """The inventory `spec` names (None: the rehearsal's), read by the first source that
    claims it."""
    spec = spec or str(DEFAULT_INVENTORY)
    source = next(s for s in SOURCES if s.claims(spec))
    return source.read(spec)


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


@dataclass(frozen=True)
class NodeList:
    """A host key that stands for several nodes: `prefix` + spec -> the nodes (and the
    ones skipped, with why); `fields` adds host fields the spec implies."""

    prefix: str
    nodes: Callable[[str], slurm.Nodes]
    fields: Callable[[str], dict[str, str | bool]] = lambda spec: {}  # slurm_job, slurm_node

    def claims(self, key: str) -> bool:
        """A host key that stands for several nodes (`gpu[01-04]`, `slurm:job=N`)."""
        return key.startswith(self.prefix) and (bool(self.prefix) or "[" in key)


def _expanded(text: str) -> slurm.Nodes:
    return slurm.Nodes(hostlist.expand(text))


NODE_LISTS: tuple[NodeList, ...] = (
    # a job's nodes carry its id: `connection: srun` starts its steps in that job
    NodeList(
        SLURM_PREFIX + "job=", slurm.job_nodes, lambda job: {"slurm_job": job, "slurm_node": True}
    ),
    NodeList(SLURM_PREFIX + "partition=", slurm.partition_nodes, lambda _: {"slurm_node": True}),
    # slurm:gpu[01-04], checked by sinfo
    NodeList(SLURM_PREFIX, slurm.listed_nodes, lambda _: {"slurm_node": True}),
    NodeList("", _expanded),  # gpu[01-04]
)


@dataclass
class Expanded:
    """Host entries with node lists expanded, the groups node lists made, and the nodes
    skipped (node -> why, in Slurm's words)."""

    hosts: JsonObject  # the inventory YAML's `hosts:`, before validation
    groups: dict[str, list[str]]
    skipped: dict[str, str]


def expand_entries(raw_hosts: JsonObject, source: str) -> Expanded:  # the YAML's
    """Host entries with node lists expanded: a key NODE_LISTS claims is one entry per
    node, each with the entry's fields (its address is the node name); `group: NAME` in
    such an entry makes the nodes a group."""
    out = Expanded({}, {}, {})
    for key, fields in raw_hosts.items():
        key = str(key)
        kind = next((n for n in NODE_LISTS if n.claims(key)), None)
        if kind is None:
            out.hosts[key] = fields
            continue
        fields = dict(fields or {})
        if "address" in fields:
            raise UserError(f"{source}: hosts.{key}.address: a node list's address is each "
                            "node's name (set it per host instead)")  # fmt: skip
        group = fields.pop("group", None)
        where = source if source == key else f"{source}: hosts.{key}"
        spec = key[len(kind.prefix) :]
        try:
            nodes = kind.nodes(spec)
        except UserError as exc:
            if not str(exc).startswith("host list"):  # Slurm's answers name their spec
                raise
            raise UserError(f"{where}: {exc}") from None
        fields = {**kind.fields(spec), **fields}
        for node in nodes.names:
            if node in out.hosts:
                raise UserError(f"{source}: hosts.{key}: {node} is listed twice")
            out.hosts[node] = fields
        out.skipped.update(nodes.skipped)
        if group:
            out.groups[str(group)] = nodes.names
    return out
