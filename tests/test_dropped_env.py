"""Issue 80, bullet 6: `launch` dropped login variables and said nothing: a TZ was judged
as a path under the directory the server starts in (the C library reads it under the
zoneinfo folder), and every variable off the allow-list (PYTORCH_CUDA_ALLOC_CONF, ...)
went unsaid. Now the dry run names every variable of the login the server will not get,
each kind with why; TZ is judged where the C library reads it; the login session's own
variables (SSH_*, XDG_*, PWD, ...) are not worth a word."""

from __future__ import annotations

import pytest

from gpufleet.host.agent import childenv
from test_reliability import record


def test_tz_is_judged_where_the_c_library_reads_it(tmp_path, monkeypatch):
    """A relative TZ is a zoneinfo name: never resolved against the server's directory
    (one another user may write dropped TZ=Europe/Paris, unsaid); `:/path` and `/path`
    are files, judged as such; a POSIX rule names no file."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.chdir(shared)
    for kept in (
        "Europe/Paris",
        ":Etc/UTC",
        "UTC",
        "CET-1CEST,M3.5.0,M10.5.0/3",
        ":/etc/localtime",
    ):
        env, dropped = childenv.login_env({"TZ": kept})
        assert env.get("TZ") == kept and dropped == [], (kept, dropped)
    env, dropped = childenv.login_env({"TZ": f":{shared}/zone"})
    assert "TZ" not in env and dropped == ["TZ"]
    # a library path stays judged against the server's directory (issue 68.2)
    env, dropped = childenv.login_env({"CUDA_INJECTION64_PATH": "lib/inject.so"})
    assert dropped == ["CUDA_INJECTION64_PATH"]


@pytest.mark.slow(minutes=1)
def test_the_dry_run_says_what_the_login_loses_and_why(fleet, fresh_sshd, tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    theirs.chmod(0o777)
    setenv = (f"TZ=Europe/Paris CUDA_INJECTION64_PATH={theirs}/inject.so "
              "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True PYTHONUNBUFFERED=1")  # fmt: skip
    sshd = fresh_sshd(extra_options=[f"SetEnv={setenv}"])
    fleet.add_sshd_host("v0", sshd, 80)
    profile = fleet.profile("dropped", tp=1)
    out = fleet.cli("launch", "--profile", str(profile), "--hosts", "v0", "--dry-run")
    said = out.stdout + out.stderr
    assert out.returncode == 0, said[-2000:]
    lines = [ln for ln in said.splitlines() if "not passed to the server" in ln]
    assert len(lines) == 2, said  # the unsafe one as a warning, the rest as a note
    warning = next(ln for ln in lines if "warning:" in ln)
    note = next(ln for ln in lines if "note:" in ln)
    assert "CUDA_INJECTION64_PATH (they name a path another user may write)" in warning
    assert "PYTHONUNBUFFERED (they load code or steer the loader)" in note, note
    assert "PYTORCH_CUDA_ALLOC_CONF (not on the allow-list" in note, note
    assert "TZ" not in note + warning and "SSH_" not in note, note  # kept; the session's own
    record("dropped_login_variables", {"said_in_dry_run": ["CUDA_INJECTION64_PATH",
                                       "PYTHONUNBUFFERED", "PYTORCH_CUDA_ALLOC_CONF"],
                                       "tz_kept": True})  # fmt: skip
