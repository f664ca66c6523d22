"""Run only by tests/test_suite_hygiene.py, in a pytest of its own: tests that leave what
they launched, to prove the fixtures stop it and the session's end fails on the rest.
Its name matches no test file pattern, so the suite never collects it."""

from __future__ import annotations

import os
import subprocess

import pytest

if os.environ.get("GPUFLEET_SUITE_PROBE") != "1":
    pytest.skip("a probe, run by test_suite_hygiene.py", allow_module_level=True)


def test_leaves_a_server_running(fleet):
    """A launch never stopped, as a test that fails halfway leaves it."""
    profile = fleet.profile("left", tp=1, sim={"load-seconds": 0.2, "warmup-seconds": 0.1})
    out = fleet.cli("launch", "--profile", str(profile), "--hosts", "h0")
    assert out.returncode == 0, out.stdout + out.stderr
    print("server launched")


def test_leaves_a_stray_process(tmp_path_factory):
    """A process no fixture knows, working in the session's folder."""
    stray = tmp_path_factory.getbasetemp() / "stray"
    stray.mkdir()
    subprocess.Popen(["sleep", "300"], cwd=stray, start_new_session=True)


def test_home_is_the_sessions_own(tmp_path_factory):
    home = os.path.expanduser("~")
    assert home.startswith(str(tmp_path_factory.getbasetemp())), home
