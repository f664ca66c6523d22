"""Issue 51: a connection cut during an SFTP transfer is the host's connection failing, in one
line, never an internal error. paramiko raises SSHException ("Server connection dropped") or
OSError ("Socket is closed") then; download caught neither of the first, so a finished run's
download cut by a killed sshd was recorded FAILED and the next cell cleaned the host
(test_reliability.py::test_a_run_whose_download_is_cut_is_fetched_on_resume_never_measured_again,
over a real sshd). Here: the rule that keeps the next SFTP call from being the next case."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from paramiko import SSHException

from gpufleet.control.connect import ssh
from gpufleet.errors import HostError
from gpufleet.kinds import Kind

pytestmark = pytest.mark.unit

SOURCE = Path(ssh.__file__)


def _parents(tree: ast.AST) -> dict[ast.AST, ast.AST]:
    return {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def _inside_over_sftp(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.With):
            for item in node.items:
                call = item.context_expr
                if isinstance(call, ast.Call) and getattr(call.func, "id", "") == "over_sftp":
                    return True
    return False


def test_every_sftp_call_maps_a_cut_connection_to_one_line():
    """A census of ssh.py: each `.sftp()` (a channel, then transfers on it) runs inside
    `with over_sftp(...)`; each read of SftpTree (the trust rule's view) turns a cut into
    OSError, which its callers already say in one line."""
    tree = ast.parse(SOURCE.read_text())
    parents = _parents(tree)
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
             and isinstance(n.func, ast.Attribute) and n.func.attr == "sftp"]  # fmt: skip
    assert len(calls) >= 3  # the tree, upload, download
    bare = [n.lineno for n in calls if not _inside_over_sftp(n, parents)]
    assert bare == [], f"ssh.py: .sftp() outside `with over_sftp(...)` at lines {bare}"
    [tree_class] = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)
                    and n.name == "SftpTree"]  # fmt: skip
    reads = [f for f in tree_class.body if isinstance(f, ast.FunctionDef) and f.name != "__init__"]
    undecorated = [f.name for f in reads
                   if "_cut_is_oserror" not in [getattr(d, "id", "") for d in f.decorator_list]]  # fmt: skip
    assert reads and undecorated == [], undecorated


class _Cut:
    """An SFTP client whose connection just ended, as paramiko's raises."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def __getattr__(self, name):
        def call(*args):
            raise self.exc

        return call


@pytest.mark.parametrize("exc", [SSHException("Server connection dropped: "), EOFError(),
                                 OSError("Socket is closed")])  # fmt: skip
def test_a_cut_is_a_connection_error_in_one_line(exc):
    with pytest.raises(HostError) as raised, ssh.over_sftp("cannot fetch /w/runs/r/a.json"):
        raise exc
    assert raised.value.kind == Kind.CONNECTION
    assert str(raised.value).startswith("cannot fetch /w/runs/r/a.json: ")
    assert "\n" not in str(raised.value) and str(raised.value).split(": ", 1)[1]
    if not isinstance(exc, OSError):
        with pytest.raises(ConnectionError):
            ssh.SftpTree(_Cut(exc)).lstat("/usr")
    with pytest.raises(FileNotFoundError):  # an answer, not a cut: passes through
        ssh.SftpTree(_Cut(FileNotFoundError(2, "No such file"))).lstat("/nope")
