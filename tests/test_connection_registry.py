"""Issues 66.3 and 82.1: each way of reaching a host declares its own settings and is found
by name. A new connection is one module (its settings model, with fields of its own, and
its Session) and one entry in control/inventory/connections.py: this test adds one at run
time (a container on this machine, named by a `container:` field no other connection has)
and drives it through the inventory, `inv hosts`' description, the verbs' fields and the
pool, touching nothing else."""

from __future__ import annotations

import pytest

from gpufleet.control.connect.base import Session
from gpufleet.control.connect.local import LocalSession
from gpufleet.control.connect.pool import open_session
from gpufleet.control.inventory import connections
from gpufleet.control.inventory.model import load_inventory
from gpufleet.errors import UserError
from gpufleet.host.agent.protocol import StatusArgs


# -- the new connection's one module: its settings model and its Session ------------
class ContainerSettings(connections.Settings):
    """A container on this machine: its name, which only this connection has, checked
    where the settings are read."""

    address: str = "localhost"
    container: str

    def describe(self) -> str:
        return f"container {self.container} on {self.address}"

    def verb_fields(self) -> dict[str, str]:
        return {"slurm_node": self.container}  # a verb field it sets (here: any one)


class ContainerSession(LocalSession):
    """Runs the agent here (a real one would `docker exec` into `container`)."""


# -- its registry line --------------------------------------------------------------
@pytest.fixture
def container(monkeypatch):
    entry = connections.Connection("container", ContainerSettings, __name__, "ContainerSession")
    monkeypatch.setitem(connections.CONNECTIONS, "container", entry)


def _inventory(tmp_path, fields: str):
    path = tmp_path / "inv.yaml"
    path.write_text(f"defaults:\n  user: ops\n  port: 2222\nhosts:\n  a:\n{fields}")
    return load_inventory(path)


def test_a_connection_with_a_field_of_its_own_is_one_module_and_one_line(tmp_path, container):
    host = _inventory(tmp_path, "    connection: container\n    container: web1\n").hosts["a"]
    assert host.settings == ContainerSettings(address="a", container="web1")
    assert host.container == "web1"  # its own field reads as the host's
    assert host.settings.describe() == "container web1 on a"
    session = open_session(host)
    try:
        assert type(session) is ContainerSession
        assert session.with_host(StatusArgs()).slurm_node == "web1"
    finally:
        session.close()


def test_a_connections_own_check_refuses_at_load_in_one_line(tmp_path, container):
    with pytest.raises(UserError) as refused:
        _inventory(tmp_path, "    connection: container\n")
    assert str(refused.value).endswith("inv.yaml: hosts.a.container: required key is missing")
    with pytest.raises(UserError) as refused:
        _inventory(tmp_path, "    connection: container\n    container: [1]\n")
    assert "inv.yaml: hosts.a.container: Input should be" in str(refused.value)


def test_a_field_no_connection_declares_is_an_unknown_key(tmp_path, container):
    """Before issue 82 the host model declared every connection's fields flat and forbade
    others: a trial connection's `container` was refused as an unknown key. Now it is the
    container connection's, and a field nobody declares is still refused."""
    with pytest.raises(UserError) as refused:
        _inventory(tmp_path, "    connection: local\n    cointainer: web1\n")
    assert str(refused.value).endswith("inv.yaml: hosts.a.cointainer: unknown key")


def test_the_built_in_connections_describe_themselves(tmp_path):
    inv = _inventory(tmp_path, "    address: 192.0.2.7\n")
    assert inv.hosts["a"].settings.describe() == "ops@192.0.2.7:2222"
    assert inv.hosts["a"].port == 2222
    local = _inventory(tmp_path, "    connection: local\n").hosts["a"]
    assert local.settings.describe() == "local" and local.settings.verb_fields() == {}
    srun = _inventory(tmp_path, "    connection: srun\n    slurm_job: '42'\n").hosts["a"]
    assert srun.settings.describe() == "srun: job 42 on a"
    assert srun.settings.verb_fields() == {"slurm_job": "42", "slurm_node": "a"}
    with pytest.raises(AttributeError):
        local.port  # noqa: B018 (a local host has no SSH port)
    assert issubclass(ContainerSession, Session)


def test_an_unknown_connection_is_named_with_the_ones_there_are(tmp_path):
    path = tmp_path / "inv.yaml"
    path.write_text("hosts:\n  a:\n    connection: telnet\n")
    with pytest.raises(UserError, match="Input should be 'ssh', 'local' or 'srun'"):
        load_inventory(path)


def test_only_the_registry_chooses_a_session_class():
    """No `if host.connection == ...` left: each Session class is named by its own module
    and by the registry, nowhere else."""
    from pathlib import Path

    src = Path(connections.__file__).resolve().parents[2]
    for entry in connections.CONNECTIONS.values():
        naming = sorted(
            str(p.relative_to(src))
            for p in src.rglob("*.py")
            if "__pycache__" not in p.parts and entry.session in p.read_text()
        )
        own = entry.module.removeprefix("gpufleet.").replace(".", "/") + ".py"
        assert naming == sorted([own, "control/inventory/connections.py"]), entry.name
    text = "\n".join(p.read_text() for p in src.rglob("*.py") if "__pycache__" not in p.parts)
    assert ".connection ==" not in text
