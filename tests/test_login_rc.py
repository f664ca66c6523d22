"""A simulated host's login runs no rc file unless asked (gpufleet/sim/sshd.py, `login_rc`):
this machine's own ~/.bashrc (pyenv init on the CI machine) cost every ssh channel of the
suite 0.1 CPU-s. Real sshd, real bash, a real rc file that leaves a mark when it runs."""

from __future__ import annotations

import subprocess

import pytest

from gpufleet.sim.sshd import _with_setenv


def _ssh(sshd, key, command: str) -> subprocess.CompletedProcess:
    known = sshd.directory / "known_hosts"
    known.write_text(sshd.known_hosts_line())
    return subprocess.run(
        ["ssh", "-i", str(key), "-p", str(sshd.port), "-o", "BatchMode=yes",
         "-o", f"UserKnownHostsFile={known}", "-o", "StrictHostKeyChecking=yes",
         "root@127.0.0.1", command],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


@pytest.mark.parametrize("login_rc", [False, True])
def test_the_login_runs_its_rc_file_only_when_asked(fresh_sshd, ssh_keys, tmp_path, login_rc):
    home = tmp_path / "home"
    home.mkdir()
    mark = tmp_path / "rc-ran"
    (home / ".bashrc").write_text(f"echo ran >> {mark}\n")
    # the login's home, as sshd's SetEnv gives it, with a second variable beside it: the
    # shell level goes into the same SetEnv (sshd reads only the first)
    sshd = fresh_sshd(extra_options=[f"SetEnv=HOME={home} GIVEN=kept"], login_rc=login_rc)
    got = _ssh(sshd, ssh_keys, "echo $GIVEN")
    assert got.returncode == 0, got.stderr
    assert got.stdout.split() == ["kept"]
    assert (mark.read_text().split() if mark.exists() else []) == (["ran"] if login_rc else [])


def test_the_shell_level_joins_the_first_setenv_and_yields_to_one_given():
    assert _with_setenv([], "SHLVL=1") == ["SetEnv=SHLVL=1"]
    assert _with_setenv(["LogLevel=INFO", "SetEnv=A=1 B=2"], "SHLVL=1") == [
        "LogLevel=INFO",
        "SetEnv=A=1 B=2 SHLVL=1",
    ]
    assert _with_setenv(["SetEnv=A=1 SHLVL=3"], "SHLVL=1") == ["SetEnv=A=1 SHLVL=3"]
    assert _with_setenv(["SetEnv=A=1"], None) == ["SetEnv=A=1"]
