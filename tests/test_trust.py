"""Root-safe by construction (issue 34): the one trust rule, judged before anything runs.

Over real sshd as root, with uid 65534 playing the other local user. Each case plants that
user's code (a `.pth`, a `sitecustomize.py`) where root would run it, and asserts the task
refuses before it runs: the canary file the code would write never appears.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpufleet.host.agent import trust
from helpers import REPO, run_cli
from test_reliability import record

NOBODY = 65534
CANARY_CODE = "import pathlib; pathlib.Path({canary!r}).write_text('ran as root')"


def _venv(tmp_path: Path, host_python: str) -> Path:
    """A venv like a lab machine's, its packages from the test host's venv through a .pth."""
    venv = tmp_path / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, capture_output=True
    )
    site = subprocess.run(
        [host_python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    (_purelib(venv) / "host.pth").write_text(site + "\n")
    return venv


def _purelib(venv: Path) -> Path:
    return next((venv / "lib").glob("python3*/site-packages"))


def _failed_line(out: subprocess.CompletedProcess, host: str) -> str:
    lines = [ln for ln in out.stderr.splitlines() if ln.startswith(f"{host}: FAILED")]
    assert len(lines) == 1, out.stdout + out.stderr
    return lines[0]


HOSTILE_PYTHON = ["venv-0777", "site-packages-theirs", "bin-group-writable", "pyvenv-cfg-theirs",
                  "pth-adds-their-dir", "stdlib-entry-theirs"]  # fmt: skip


@pytest.mark.parametrize("case", HOSTILE_PYTHON)
def test_a_python_another_user_can_change_is_refused_before_it_runs(
    fleet, tmp_path, host_python, case
):
    canary = tmp_path / "CANARY"
    venv = _venv(tmp_path, host_python)
    purelib = _purelib(venv)
    plant = CANARY_CODE.format(canary=str(canary))
    (purelib / "zz-theirs.pth").write_text(f"import sys; {plant}\n")  # what site would run
    if case == "venv-0777":
        venv.chmod(0o777)
        hostile = venv
    elif case == "site-packages-theirs":
        os.chown(purelib, NOBODY, NOBODY)
        hostile = purelib
    elif case == "bin-group-writable":
        (venv / "bin").chmod(0o775)
        hostile = venv / "bin"
    elif case == "pyvenv-cfg-theirs":
        os.chown(venv / "pyvenv.cfg", NOBODY, NOBODY)
        hostile = venv / "pyvenv.cfg"
    elif case == "pth-adds-their-dir":
        (purelib / "zz-theirs.pth").unlink()
        theirs = tmp_path / "theirs"
        theirs.mkdir()
        (theirs / "sitecustomize.py").write_text(plant + "\n")
        os.chown(theirs, NOBODY, NOBODY)
        (purelib / "extra.pth").write_text(str(theirs) + "\n")
        hostile = theirs
    else:  # a module in the venv's lib/python3.X that another user owns
        lib = purelib.parent
        module = lib / "theirs.py"
        module.write_text(plant + "\n")
        os.chown(module, NOBODY, NOBODY)
        (purelib / "zz-theirs.pth").write_text("import theirs\n")
        hostile = module
    fleet.write_inventory(python=str(venv / "bin" / "python"))
    out = fleet.cli("gpu-clean", "--hosts", "h2")
    assert out.returncode == 1, out.stdout + out.stderr
    line = _failed_line(out, "h2")
    assert "refusing to run the host python" in line and str(hostile) in line, line
    assert "fix: " in line and ("owner uid" in line)
    assert not canary.exists(), "their code ran as root"
    assert "Traceback" not in out.stderr
    record(f"trust_python_{case}", {"exit": out.returncode, "line": line[:300]})


def test_python_trust_warn_runs_a_lab_venv_after_saying_so(fleet, tmp_path, host_python):
    venv = _venv(tmp_path, host_python)
    venv.chmod(0o777)
    fleet.write_inventory(python=str(venv / "bin" / "python"), python_trust="warn")
    out = fleet.cli("gpu-clean", "--hosts", "h2")
    assert out.returncode == 0, out.stdout + out.stderr
    said = [ln for ln in out.stderr.splitlines() if "warning" in ln]
    assert said and all(
        ln.startswith("h2: warning: running an untrusted python (python_trust: warn)")
        for ln in said
    ), said
    warning = said[0]
    assert str(venv) in warning
    # and a trusted venv says nothing (a warning must be true)
    venv.chmod(0o755)
    quiet = fleet.cli("gpu-clean", "--hosts", "h2")
    assert quiet.returncode == 0 and "untrusted" not in quiet.stderr, quiet.stderr
    record("trust_python_warn", warning[:300])


def test_a_bare_python_runs_the_system_one_judged_not_the_logins(fleet, tmp_path, fresh_sshd):
    # root's login PATH starts with a directory another user owns, holding a `python3`
    theirs = tmp_path / "theirs-bin"
    theirs.mkdir()
    canary = tmp_path / "CANARY"
    (theirs / "python3").write_text(f'#!/bin/sh\necho ran > {canary}\nexec /usr/bin/python3 "$@"\n')
    (theirs / "python3").chmod(0o755)
    os.chown(theirs, NOBODY, NOBODY)
    sshd = fresh_sshd(extra_options=[f"SetEnv=PATH={theirs}:/usr/bin:/bin"])
    fleet.add_sshd_host("h9", sshd, 63)
    fleet.write_inventory(extra_hosts={"h9": {"address": "127.0.0.1", "port": sshd.port,
                                              "python": "python3",
                                              "workdir": str(fleet.workdir("h9"))}})  # fmt: skip
    from gpufleet.control.agent import python_trust as interpreter
    from gpufleet.control.connect.local import LocalTree

    verdict = interpreter.judge_python("python3", 0, LocalTree())
    assert verdict.executable.startswith(("/usr/", "/bin/")) and not verdict.problems
    out = fleet.cli("gpu-clean", "--hosts", "h9")
    assert not canary.exists(), out.stdout + out.stderr
    assert "not found" not in out.stderr, out.stderr  # the system python3 ran (and judged)
    record("trust_bare_python", {"canary": canary.exists(), "exit": out.returncode})


def _attacker_site(tmp_path: Path) -> tuple[Path, Path]:
    theirs = tmp_path / "their-site"
    theirs.mkdir()
    canary = tmp_path / "CANARY"
    (theirs / "sitecustomize.py").write_text(
        "import os, pathlib\n"
        f"p = pathlib.Path({str(canary)!r})\n"
        "p.write_text((p.read_text() if p.exists() else '') + str(os.getpid()) + '\\n')\n"
    )
    os.chown(theirs, NOBODY, NOBODY)
    return theirs, canary


def test_the_login_environment_never_reaches_roots_children(fleet, tmp_path, fresh_sshd):
    theirs, canary = _attacker_site(tmp_path)
    sshd = fresh_sshd(extra_options=[f"SetEnv=PYTHONPATH={theirs} PYTHONSTARTUP={theirs}/x.py"])
    fleet.add_sshd_host("h9", sshd, 56)
    profile = fleet.profile("loginenv", tp=2)
    out = fleet.cli("launch", "--profile", str(profile), "--hosts", "h9")
    try:
        assert out.returncode == 0, out.stdout + out.stderr
        assert not canary.exists(), f"sitecustomize ran as root: {canary.read_text()}"
        said = [ln for ln in out.stdout.splitlines() + out.stderr.splitlines()
                if "not passed to the server from the login environment" in ln]  # fmt: skip
        assert len(said) == 1 and "PYTHONPATH" in said[0] and "PYTHONSTARTUP" in said[0], said
    finally:
        fleet.cli("stop", "--hosts", "h9", "--grace", "2")
    # on a host whose login sets none of it, nothing is said
    quiet = fleet.cli("launch", "--profile", str(profile), "--hosts", "h0")
    try:
        assert quiet.returncode == 0, quiet.stdout + quiet.stderr
        assert "login environment" not in quiet.stdout + quiet.stderr
    finally:
        fleet.cli("stop", "--hosts", "h0", "--grace", "2")
    record("trust_login_env", {"canary": canary.exists(), "said": said[0][:200]})


def test_a_profiles_own_path_variables_are_judged(fleet, tmp_path):
    theirs, canary = _attacker_site(tmp_path)
    profile = fleet.profile("envpaths", tp=1, env={"PYTHONPATH": str(theirs)})
    out = fleet.cli("launch", "--profile", str(profile), "--hosts", "h1")
    assert out.returncode == 1, out.stdout + out.stderr
    assert "env PYTHONPATH" in out.stderr and "another user owns" in out.stderr, out.stderr
    assert not canary.exists()
    record("trust_profile_env", {"exit": out.returncode, "canary": canary.exists()})


def test_a_link_ending_in_dotdot_cannot_land_the_workdir_on_a_shared_directory(fleet, tmp_path):
    sticky = tmp_path / "shared"
    sticky.mkdir()
    sticky.chmod(0o1777)
    (sticky / "mine").mkdir(mode=0o700)
    link = tmp_path / "wd"
    link.symlink_to(f"{sticky}/mine/..")  # root's own link; its target ends on /tmp-like
    with pytest.raises(trust.Untrusted, match="shared sticky directory"):
        trust.judge(str(link), 0, trust.WORKDIR)
    fleet.write_inventory(extra_hosts={"odd": {"address": "127.0.0.1",
                                               "port": fleet.sshds[0].port,
                                               "workdir": str(link)}})  # fmt: skip
    out = fleet.cli("gpu-clean", "--hosts", "odd")
    assert out.returncode == 1, out.stdout + out.stderr
    line = _failed_line(out, "odd")
    assert "shared sticky directory" in line and "fix:" in line, line
    assert not any(p.name.startswith("agent-") for p in sticky.iterdir())  # nothing uploaded
    record("trust_workdir_dotdot", line[:300])


def test_keys_are_never_written_through_a_planted_link(fleet, tmp_path):
    from test_secrets import _keyed_profile

    profile = _keyed_profile(fleet, "linkkeys")
    port = yaml.safe_load(profile.read_text())["port"] + 7  # h1's offset
    servers = fleet.workdir("h1") / "servers"
    servers.mkdir(parents=True, exist_ok=True, mode=0o700)
    victim = tmp_path / "root-owned-config"
    victim.write_text("precious\n")
    (servers / f"{port}.keys.yaml").symlink_to(victim)
    out = fleet.cli("launch", "--profile", str(profile), "--hosts", "h1")
    try:
        assert out.returncode == 0, out.stdout + out.stderr
        assert victim.read_text() == "precious\n"
        keys = servers / f"{port}.keys.yaml"
        assert not keys.is_symlink() and stat.S_IMODE(keys.stat().st_mode) == 0o600
    finally:
        fleet.cli("stop", "--hosts", "h1", "--grace", "2")
    record("trust_keys_link", {"victim_unchanged": victim.read_text() == "precious\n"})


def test_a_servers_directory_another_user_made_is_refused_not_reused(fleet, tmp_path):
    profile = fleet.profile("theirservers", tp=1)
    servers = fleet.workdir("h2") / "servers"
    servers.mkdir(parents=True, exist_ok=True)
    os.chown(servers, NOBODY, NOBODY)
    try:
        out = fleet.cli("launch", "--profile", str(profile), "--hosts", "h1,h2")
        assert out.returncode == 1, out.stdout + out.stderr
        line = _failed_line(out, "h2")
        # the bootstrap judges the workdir's tree before the agent uses any of it
        assert "refusing to run the agent: the workdir" in line and "fix: chown -R root" in line
        assert f"{servers} (owner uid 65534, mode 0755) can be changed by another user" in line
        assert list(servers.iterdir()) == []
        assert "h1: READY" in out.stdout, out.stdout  # the other host goes on
        record("trust_servers_dir", line[:300])
    finally:
        os.chown(servers, 0, 0)
        fleet.cli("stop", "--hosts", "h1,h2", "--grace", "2")


def test_the_bootstrap_runs_the_bytes_it_hashed_not_the_file(tmp_path):
    # the zip is run from memory: the path it names does not even exist any more
    import io
    import zipfile

    from gpufleet.control.agent import bootstrap

    marker = tmp_path / "ran"
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        zf.writestr("__main__.py", "import pkg.mod\n")
        zf.writestr("pkg/__init__.py", "")
        zf.writestr(
            "pkg/mod.py", f"import pathlib; pathlib.Path({str(marker)!r}).write_text(__file__)\n"
        )
    gone = tmp_path / "agent-gone.pyz"
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); from gpufleet.control.agent import bootstrap; "
        "bootstrap.run_from_memory(sys.argv[2], sys.stdin.buffer.read())"
    )
    done = subprocess.run(
        [sys.executable, "-I", "-c", code, str(REPO / "src"), str(gone)],
        input=buffer.getvalue(), capture_output=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert marker.read_text() == f"{gone}/pkg/mod.py"
    assert not gone.exists() and bootstrap.MISSING


def _program(path: Path, canary: Path) -> Path:
    path.write_text(f"#!/bin/sh\ntouch {canary}\necho '{{hosts: {{a: {{}}}}}}'\n")
    path.chmod(0o755)
    return path


@pytest.mark.parametrize("case", ["owned-by-them", "in-a-dir-they-can-write", "trusted"])
def test_an_inventory_program_runs_only_when_trusted(tmp_path, case):
    canary = tmp_path / "CANARY"
    home = tmp_path / "inv"
    home.mkdir(mode=0o755)
    program = _program(home / "fleet", canary)
    if case == "owned-by-them":
        os.chown(program, NOBODY, NOBODY)
    elif case == "in-a-dir-they-can-write":
        home.chmod(0o777)
    out = run_cli("hosts", "--inventory", str(program))
    if case == "trusted":
        assert out.returncode == 0 and canary.exists(), out.stdout + out.stderr
        return
    assert out.returncode == 2, out.stdout + out.stderr
    assert not canary.exists()
    [line] = out.stderr.strip().splitlines()
    assert line.startswith("gpufleet: refusing to run inventory program") and "fix:" in line, line
    record(f"trust_inventory_{case}", line[:300])


def test_a_bare_inventory_name_never_runs_a_file_of_the_current_directory(tmp_path):
    canary = tmp_path / "CANARY"
    _program(tmp_path / "fleet", canary)
    out = run_cli("hosts", "--inventory", "fleet", cwd=tmp_path)
    assert out.returncode == 2 and not canary.exists(), out.stdout + out.stderr
    assert "pass ./fleet to use it" in out.stderr
    (tmp_path / "hosts").mkdir()
    (tmp_path / "hosts" / "fleet.yaml").write_text("hosts: {fromyaml: {}}\n")
    chosen = run_cli("hosts", "--inventory", "fleet", cwd=tmp_path)
    assert chosen.returncode == 0 and "fromyaml" in chosen.stdout and not canary.exists()
    pasted = run_cli("hosts", "--inventory", "./fleet", cwd=tmp_path)  # the hint, pasted
    assert pasted.returncode == 0 and canary.exists(), pasted.stdout + pasted.stderr
    record("trust_inventory_bare_name", out.stderr.strip()[:300])


def test_a_python_that_is_a_script_is_refused(fleet, tmp_path):
    # a wrapper runs some python with its own variables: what that python loads first
    # (its site, its .pth files) cannot be judged from the wrapper
    canary = tmp_path / "CANARY"
    wrapper = tmp_path / "python-wrapper"
    wrapper.write_text(f'#!/bin/sh\ntouch {canary}\nexec {fleet.python} "$@"\n')
    wrapper.chmod(0o755)
    fleet.write_inventory(python=str(wrapper))
    out = fleet.cli("gpu-clean", "--hosts", "h1")
    assert out.returncode == 1 and not canary.exists(), out.stdout + out.stderr
    line = _failed_line(out, "h1")
    assert "is not a Python executable" in line and "fix: set python:" in line, line
    record("trust_python_script", line[:300])


def test_the_clean_environment_keeps_what_servers_need_and_drops_what_loads_code(tmp_path):
    from gpufleet.host.agent import childenv

    theirs = tmp_path / "their-cache"
    theirs.mkdir()
    os.chown(theirs, NOBODY, NOBODY)
    login = {
        "PATH": f"{theirs}:/usr/bin:/bin", "HOME": "/root", "https_proxy": "http://192.0.2.1:3128",
        "CUDA_HOME": "/usr", "NCCL_DEBUG": "INFO", "TRITON_CACHE_DIR": str(theirs),
        "PYTHONPATH": "/usr/lib", "LD_PRELOAD": "/usr/lib/x.so", "SSH_CONNECTION": "x",
    }  # fmt: skip
    env, dropped = childenv.login_env(login)
    assert env["PATH"] == "/usr/bin:/bin"  # their directory left out, the rest kept
    assert env["https_proxy"] == login["https_proxy"] and env["NCCL_DEBUG"] == "INFO"
    assert env["CUDA_HOME"] == "/usr" and env["HOME"] == "/root"
    assert "TRITON_CACHE_DIR" not in env and "SSH_CONNECTION" not in env
    assert dropped == ["LD_PRELOAD", "PYTHONPATH", "TRITON_CACHE_DIR"]  # said; SSH_* silently
    assert childenv.login_env({"PATH": "/usr/bin", "LANG": "C.UTF-8"})[1] == []  # nothing said


def test_relative_paths_are_judged_where_they_resolve(tmp_path, monkeypatch):
    from gpufleet.control.agent import python_trust as interpreter
    from gpufleet.control.connect.local import LocalTree

    monkeypatch.chdir(tmp_path)
    assert trust.judge("wd", 0, trust.WORKDIR, create=True) == str(tmp_path / "wd")
    verdict = interpreter.judge_python("venv/bin/python", 0, LocalTree(), str(tmp_path))
    assert verdict.executable == str(tmp_path / "venv" / "bin" / "python")


def test_a_venv_whose_home_is_relative_is_judged_not_a_crash(tmp_path):
    from gpufleet.control.agent import python_trust as interpreter
    from gpufleet.control.connect.local import LocalTree

    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    os.symlink(os.path.realpath(sys.executable), venv / "bin" / "python")
    (venv / "pyvenv.cfg").write_text("home = ../elsewhere/bin\n")
    verdict = interpreter.judge_python(str(venv / "bin" / "python"), 0, LocalTree())
    assert str(tmp_path / "elsewhere" / "bin") in verdict.judged and not verdict.problems


def test_the_connecting_user_is_asked_not_inferred_from_the_sftp_start_directory(
    fleet, tmp_path, host_python, fresh_sshd
):
    """Issue 50: the connecting user was taken to be the owner of the SFTP start directory;
    a server configured with another start directory (`internal-sftp -d`) owned by another
    user made the trust rule trust that user, and a venv of theirs ran as root. The uid is
    asked of the host (`id -u`) now."""
    start = tmp_path / "their-start"
    start.mkdir()
    os.chown(start, NOBODY, NOBODY)
    canary = tmp_path / "CANARY"
    venv = _venv(tmp_path, host_python)
    purelib = _purelib(venv)
    (purelib / "zz-theirs.pth").write_text(
        f"import sys; {CANARY_CODE.format(canary=str(canary))}\n"
    )
    os.chown(purelib, NOBODY, NOBODY)
    sshd = fresh_sshd(sftp_start=str(start))
    fleet.add_sshd_host("h8", sshd, 64)
    fleet.write_inventory(extra_hosts={"h8": {"address": "127.0.0.1", "port": sshd.port,
                                              "python": str(venv / "bin" / "python"),
                                              "workdir": str(fleet.workdir("h8"))}})  # fmt: skip
    out = fleet.cli("gpu-clean", "--hosts", "h8")
    assert out.returncode == 1, out.stdout + out.stderr
    line = _failed_line(out, "h8")
    assert "refusing to run the host python" in line and str(purelib) in line, line
    assert not canary.exists(), "their code ran as root"
    record("trust_sftp_start_directory", {"exit": out.returncode, "line": line[:200]})


def _preload_library(tmp_path: Path, marker: Path) -> Path:
    """A shared object another user owns whose constructor records who loaded it."""
    theirs = tmp_path / "their-lib"
    theirs.mkdir()
    source = theirs / "mark.c"
    source.write_text(
        "#include <stdio.h>\n#include <unistd.h>\n"
        "__attribute__((constructor)) static void mark(void) {\n"
        f'  FILE *f = fopen("{marker}", "a");\n'
        '  char comm[64] = {0}; FILE *c = fopen("/proc/self/comm", "r");\n'
        "  if (c) { fgets(comm, sizeof comm, c); fclose(c); }\n"
        '  if (f) { fprintf(f, "%d uid=%d %s", getpid(), getuid(), comm); fclose(f); }\n'
        "}\n"
    )
    library = theirs / "libmark.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    os.chown(theirs, NOBODY, NOBODY)
    os.chown(library, NOBODY, NOBODY)
    return library


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc to build the library")
def test_a_loader_variable_the_login_exports_never_reaches_the_agent(fleet, tmp_path, fresh_sshd):
    """Issue 50: the remote command was `exec python -I ...`; `-I` neutralises PYTHON*
    only, so an LD_PRELOAD a login's rc exported loaded another user's library into the
    agent, as root, before its first line. Now the login shell unsets every loader and
    library variable with a builtin, and the agent starts in an empty environment."""
    marker = tmp_path / "LOADED"
    library = _preload_library(tmp_path, marker)
    # the login's environment carries it (sshd's SetEnv here; a module system or an rc
    # on a real host): the login shell itself loads it before any command of gpufleet's
    sshd = fresh_sshd(extra_options=[f"SetEnv=LD_PRELOAD={library} HF_HOME=/data/hf"])
    fleet.add_sshd_host("h7", sshd, 65)
    out = fleet.cli("status", "--hosts", "h7")
    assert out.returncode == 0, out.stdout + out.stderr
    # the login shell and its rc's programs load it before gpufleet's command runs; nothing
    # gpufleet executes does
    loaded = marker.read_text().splitlines() if marker.exists() else []
    ours = [ln for ln in loaded if ln.split()[-1] in ("python", "python3", "env")
            or ln.split()[-1].startswith("python3")]  # fmt: skip
    assert ours == [], loaded
    from gpufleet.host.agent import loginenv

    assert "LD_PRELOAD" in loginenv.LOADER_VARIABLES
    record("trust_login_ld_preload", {"rc_programs": len(loaded), "gpufleets": len(ours)})


def _launch_on_login(fleet, fresh_sshd, setenv: str, name: str):
    """A host h8 whose login sets `setenv` (sshd's SetEnv), and a launch of a one-GPU
    rehearsal profile `name` there: the profile and the CLI's result."""
    sshd = fresh_sshd(extra_options=[f"SetEnv={setenv}"])
    fleet.add_sshd_host("h8", sshd, 63)
    profile = fleet.profile(name, tp=1)
    return profile, fleet.cli("launch", "--profile", str(profile), "--hosts", "h8")


def test_harmless_login_variables_are_said_only_where_they_may_matter(fleet, fresh_sshd):
    """Issue 64, trip 6: every launch warned "not passed to the server from the login
    environment: PYTHONUNBUFFERED..." where nothing was wrong. A code-loading variable with
    a harmless value is now said in the dry run and when the launch fails (an
    LD_LIBRARY_PATH the engine needed may be why), never on a launch that succeeds; one
    naming another user's path is still said at every launch (the test above)."""
    profile, out = _launch_on_login(
        fleet, fresh_sshd, "PYTHONUNBUFFERED=1 LD_LIBRARY_PATH=/usr/lib", "harmless"
    )
    try:
        assert out.returncode == 0, out.stdout + out.stderr
        assert "login environment" not in out.stdout + out.stderr
        assert "warning" not in out.stdout + out.stderr
    finally:
        fleet.cli("stop", "--hosts", "h8", "--grace", "2")
    dry = fleet.cli("launch", "--profile", str(profile), "--hosts", "h8", "--dry-run")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert "note: not passed to the server from the login environment: LD_LIBRARY_PATH, " \
           "PYTHONUNBUFFERED" in dry.stdout, dry.stdout  # fmt: skip
    broken = fleet.profile("breaks", tp=1, sim={"load-seconds": 0.2, "crash-during-load": True})
    failed = fleet.cli("launch", "--profile", str(broken), "--hosts", "h8")
    fleet.cli("stop", "--hosts", "h8", "--grace", "2")
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert "LD_LIBRARY_PATH, PYTHONUNBUFFERED" in failed.stdout + failed.stderr


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc to build the library")
def test_a_loader_variable_the_login_made_readonly_stops_the_login_before_anything_runs(
    fleet, tmp_path, fresh_sshd
):
    """Issue 68.1: `readonly LD_PRELOAD=...` (or bash's `declare -r`) in a login's rc
    survived the login shell's `unset`, and `/usr/bin/env` loaded it as uid 0 while
    gpu-clean printed "verified clean". The shell now checks after unsetting and refuses,
    in one line naming the variable, before it executes anything."""
    from gpufleet.control.connect.base import clean_start

    marker = tmp_path / "LOADED"
    library = _preload_library(tmp_path, marker)
    for shell, how in (("bash", "readonly"), ("bash", "declare -r"), ("dash", "readonly")):
        if shutil.which(shell) is None:
            continue
        out = subprocess.run(
            [shell, "-c", f"{how} LD_PRELOAD={library}; export LD_PRELOAD; "
             + clean_start("/bin/echo started")],
            capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"},
        )  # fmt: skip
        assert out.returncode == 97 and "started" not in out.stdout, (shell, how, out)
        assert "cannot unset (readonly" in out.stderr and "LD_PRELOAD" in out.stderr
        assert not marker.exists(), (shell, how, marker.read_text())
    # over a real sshd: bash run by sshd reads ~/.bashrc (not BASH_ENV); this login's HOME
    # is a folder of the test's, whose .bashrc makes the variable readonly
    home = tmp_path / "home"
    home.mkdir()
    (home / ".bashrc").write_text(f"readonly LD_PRELOAD={library}\nexport LD_PRELOAD\n")
    sshd = fresh_sshd(extra_options=[f"SetEnv=HOME={home}"], login_rc=True)
    fleet.add_sshd_host("h9", sshd, 67)
    out = fleet.cli("gpu-clean", "--hosts", "h9")
    assert out.returncode == 1, out.stdout + out.stderr
    failed = [ln for ln in out.stderr.splitlines() if ln.startswith("h9: FAILED")]
    assert len(failed) == 1 and "the login keeps loader variables" in failed[0], out.stderr
    assert failed[0].rstrip().endswith("LD_PRELOAD"), failed[0]
    loaded = marker.read_text().splitlines() if marker.exists() else []
    assert not [ln for ln in loaded if ln.split()[-1] in ("env", "python3", "python")], loaded
    record("trust_readonly_loader_variable", {"refused": True, "loaded_by_gpufleet": 0})


def test_a_relative_library_path_is_judged_where_the_server_starts(fleet, tmp_path, fresh_sshd):
    """Issue 68.2: `CUDA_INJECTION64_PATH=../foreign/evil.so` passed (only absolute paths
    were judged) and libcuda loads it at CUDA init, resolved against the server's cwd:
    the host's workdir. Relative paths are now resolved there and judged like the rest,
    in a profile's env (refused) and in the login's (not passed, said)."""
    theirs = fleet.workdir("h0").parent / "foreign"
    theirs.mkdir(parents=True, exist_ok=True)
    (theirs / "evil.so").write_bytes(b"\x7fELF")
    os.chown(theirs, NOBODY, NOBODY)
    os.chown(theirs / "evil.so", NOBODY, NOBODY)
    profile = fleet.profile("relative", tp=1, env={"CUDA_INJECTION64_PATH": "../foreign/evil.so"})
    out = fleet.cli("launch", "--profile", str(profile), "--hosts", "h0")
    assert out.returncode == 1, out.stdout + out.stderr
    assert "env CUDA_INJECTION64_PATH:" in out.stderr and "foreign" in out.stderr, out.stderr
    # the same value from the login: kept from the server, and said at the launch
    _, launched = _launch_on_login(
        fleet, fresh_sshd, "CUDA_INJECTION64_PATH=../foreign/evil.so", "plain"
    )
    try:
        assert launched.returncode == 0, launched.stdout + launched.stderr
        said = launched.stdout + launched.stderr
        assert "not passed to the server from the login environment: CUDA_INJECTION64_PATH" \
            in said, said  # fmt: skip
        state = next((fleet.workdir("h8") / "servers").glob("*.json")).read_text()
        assert "CUDA_INJECTION64_PATH" not in state
    finally:
        fleet.cli("stop", "--hosts", "h8", "--grace", "2")
    record("trust_relative_library_path", {"profile": "refused", "login": "not passed"})


def test_a_path_the_user_may_not_look_at_is_untrusted_not_a_crash(tmp_path):
    """A run_as runner's PATH held root's interpreter directory (/root/.pyenv/...): judging
    it as that user raised PermissionError, so every level with `--client-procs 2` failed
    at once ("load generator error: PermissionError"). Judged as another user, in a real
    child process with that user's uid: untrusted, said, and left out of PATH."""
    from gpufleet.host.agent import childenv

    private = tmp_path / "roots"
    (private / "bin").mkdir(parents=True)
    private.chmod(0o700)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the other user
        try:
            os.close(read)
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            said = trust.trusted(str(private / "bin"), NOBODY, trust.ANY) or ""
            kept = childenv._trusted_path(f"{private}/bin:/usr/bin")
            os.write(write, f"{said}\n{kept}".encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as fh:
        said, kept = fh.read().split("\n")
    os.waitpid(pid, 0)
    assert "cannot be judged: Permission denied" in said and str(private) in said
    assert kept == "/usr/bin"
