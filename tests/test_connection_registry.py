"""Issue 66.3: each way of reaching a host owns its settings and is found by name. A new
connection is its Session module and one entry in control/inventory/connections.py: this
test adds one at run time (a local session under another name) and drives it through the
inventory and the pool, touching nothing else."""

from __future__ import annotations

import dataclasses

import pytest

from gpufleet.control.connect.local import LocalSession
from gpufleet.control.connect.pool import open_session
from gpufleet.control.inventory import connections
from gpufleet.control.inventory.model import load_inventory
from gpufleet.errors import UserError


class LoopbackSession(LocalSession):
    """The new connection's Session: this module is its 'one new module'."""


@dataclasses.dataclass(frozen=True)
class LoopbackSettings:
    """Its settings: a loopback address only, checked where the settings are read."""

    address: str

    @classmethod
    def of(cls, host) -> LoopbackSettings:
        if host.address not in ("localhost", "127.0.0.1"):
            raise ValueError(f"connection: loopback reaches this machine only, not {host.address}")
        return cls(host.address)


@pytest.fixture
def loopback(monkeypatch):
    entry = connections.Connection("loopback", LoopbackSettings, __name__, "LoopbackSession")
    monkeypatch.setitem(connections.CONNECTIONS, "loopback", entry)
    monkeypatch.setattr(connections, "NAMES", (*connections.NAMES, "loopback"))


def _inventory(tmp_path, address: str):
    path = tmp_path / "inv.yaml"
    path.write_text(f"hosts:\n  a:\n    connection: loopback\n    address: {address}\n")
    return load_inventory(path)


def test_a_connection_added_by_its_registry_line_is_found_by_name(tmp_path, loopback):
    host = _inventory(tmp_path, "localhost").hosts["a"]
    session = open_session(host)
    try:
        assert type(session) is LoopbackSession
        assert connections.settings_of(host) == LoopbackSettings("localhost")
    finally:
        session.close()


def test_a_connections_own_check_refuses_at_load_in_one_line(tmp_path, loopback):
    with pytest.raises(UserError) as refused:
        _inventory(tmp_path, "192.0.2.7")
    assert "connection: loopback reaches this machine only, not 192.0.2.7" in str(refused.value)
    assert "\n" not in str(refused.value).strip()


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
