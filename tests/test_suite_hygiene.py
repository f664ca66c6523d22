"""The suite keeps to itself (issue 82): it never reads or writes the user's own
~/.gpufleet, every fixture stops what its test launched, pass or fail, and the session
ends by failing on any process it left."""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
from pathlib import Path

from helpers import REPO, launched_under


def test_the_suite_runs_in_a_home_of_its_own(tmp_path_factory):
    """`~` (the rehearsal inventory's workdir, the local connection's, the agent build
    cache) is the session's, under its temporary folder: never the user's."""
    import yaml

    home = Path(os.path.expanduser("~"))
    assert home.is_relative_to(tmp_path_factory.getbasetemp()), home
    assert home != Path(pwd.getpwuid(os.getuid()).pw_dir)
    workdir = yaml.safe_load((REPO / "hosts/rehearsal.yaml").read_text())["defaults"]["workdir"]
    assert Path(os.path.expanduser(workdir)).is_relative_to(home)


def test_fixtures_stop_what_a_test_launched_and_the_session_fails_on_a_stray(tmp_path):
    """A pytest of its own over tests/suite_probe.py: a test launches a server on a fleet
    host and never stops it (the `fleet` fixture stops it), another leaves a process no
    fixture knows (the session's end names it, stops it and fails)."""
    base = tmp_path / "probe"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "GPUFLEET_TEST_W"))}
    env["GPUFLEET_SUITE_PROBE"] = "1"
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:cacheprovider",
         "--basetemp", str(base), "tests/suite_probe.py"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    text = out.stdout + out.stderr
    assert out.returncode == 1, text[-3000:]
    assert "3 passed, 1 error" in text, text[-3000:]
    left = text.split("the session left processes running", 1)[-1]
    assert "sleep 300" in left and "launch_server" not in left, text[-3000:]
    assert launched_under(base) == [], "still running after the probe's session"
