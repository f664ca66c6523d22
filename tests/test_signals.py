"""SIGTERM and SIGHUP are interrupts too (issue 81.8): `timeout`, a CI cancel, systemd and a
scheduler's limit send SIGTERM, a closed terminal SIGHUP; a task killed so printed nothing
and left its level and its server behind. Each now takes Ctrl-C's path, installed in one
place (cli/common.py `interrupts_handled_by`); the real tasks under SIGTERM are in
test_interrupt.py and test_slurm_real.py."""

from __future__ import annotations

import ast
import os
import signal
from pathlib import Path

import pytest

from gpufleet.cli.common import INTERRUPTS, interrupts_handled_by

SRC = Path(__file__).resolve().parents[1] / "src" / "gpufleet"
SIGNALS = [signal.SIGINT, signal.SIGTERM, signal.SIGHUP]


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_every_interrupt_raises_what_ctrl_c_raises_and_the_old_handler_comes_back(sig):
    before = signal.getsignal(sig)
    with pytest.raises(KeyboardInterrupt), interrupts_handled_by(None):
        os.kill(os.getpid(), sig)
        signal.sigtimedwait([], 0.01)  # the handler runs at the next bytecode
    assert signal.getsignal(sig) == before


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_a_tasks_own_handler_hears_every_interrupt_with_its_name(sig):
    heard = []
    with interrupts_handled_by(lambda signum, frame: heard.append(signum)):
        os.kill(os.getpid(), sig)
        signal.sigtimedwait([], 0.01)
    assert heard == [sig]


def test_the_control_plane_sets_signal_handlers_in_one_place():
    """A handler set anywhere else would leave SIGTERM (or SIGHUP) off a task's path."""
    found = []
    for path in sorted((SRC / "cli").glob("*.py")) + sorted((SRC / "control").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "signal.signal":
                scope = path.relative_to(SRC).as_posix()
                found.append(scope)
    assert set(found) == {"cli/common.py"}, found
    assert {"SIGINT", "SIGTERM", "SIGHUP"} <= set(INTERRUPTS)
