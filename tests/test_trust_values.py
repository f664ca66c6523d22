"""Two classes of issue 50 in the one place that judges a profile's and a login's values
(host/agent/childenv.py, host/agent/trust.py): a value is judged by every absolute path any
reader could find in it (ld.so splits LD_PRELOAD on spaces too: a space-separated second
library was judged as part of one missing path, and kept); and a path that does not exist
passes only where no other user could create it (it was trusted as missing, then made by
another user before the server started)."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.host.agent import childenv, trust

pytestmark = pytest.mark.unit


@pytest.fixture
def places(tmp_path):
    """A directory only root controls, one any user may write, a shared sticky one, and a
    library in each of the first two."""
    own, open_, sticky = tmp_path / "own", tmp_path / "open", tmp_path / "sticky"
    for folder, mode in ((own, 0o755), (open_, 0o777), (sticky, 0o1777)):
        folder.mkdir()
        folder.chmod(mode)
    (own / "good.so").write_bytes(b"")
    (open_ / "evil.so").write_bytes(b"")
    return own, open_, sticky


def test_ld_preload_is_judged_as_the_loader_splits_it(places):
    own, open_, _ = places
    for value in (f"{own}/good.so {open_}/evil.so", f"{own}/good.so:{open_}/evil.so",
                  f"{own}/good.so\t{open_}/evil.so", f"--lib={open_}/evil.so"):  # fmt: skip
        said = childenv.refusals({"LD_PRELOAD": value})
        assert len(said) == 1 and f"{open_}" in said[0], (value, said)
    assert childenv.refusals({"LD_PRELOAD": f"{own}/good.so {own}/good.so"}) == []


@settings(max_examples=50, deadline=None)
@given(seps=st.lists(st.sampled_from([" ", ":", ",", ";", "  ", "\n", " : "]), min_size=1,
                     max_size=3))  # fmt: skip
def test_any_separator_between_paths_still_finds_the_untrusted_one(seps):
    root = "/tmp/gpufleet-trust-values"
    os.makedirs(f"{root}/open", exist_ok=True)
    os.chmod(root, 0o755)
    os.chmod(f"{root}/open", 0o777)
    value = "/usr/lib/x.so" + "".join(seps) + f"{root}/open/evil.so"
    assert childenv.untrusted_paths(value), value


def test_a_missing_path_passes_only_where_nobody_else_could_create_it(places):
    own, open_, sticky = places
    uid = os.geteuid()
    assert trust.trusted(f"{own}/later/lib.so", uid, trust.ANY) is None
    said = trust.trusted(f"{open_}/later/lib.so", uid, trust.ANY)  # refused on the way
    assert said and f"{open_} (owner uid 0, mode 0777) is writable by other users" in said
    for missing in (f"{sticky}/later/lib.so", f"{sticky}/lib.so"):  # /tmp's case: was None
        said = trust.trusted(missing, uid, trust.ANY)
        assert said and f"{missing} does not exist, and another user could create it" in said
        assert "a shared sticky directory" in said, said
    said = childenv.refusals({"HF_HOME": f"{sticky}/hf-cache"})
    assert len(said) == 1 and "another user could create it" in said[0]


def test_no_child_of_the_agent_runs_a_user_site(tmp_path):
    """A bare interpreter (no venv) runs `usercustomize` from the user site of whatever
    HOME it has; the agent's children get PYTHONNOUSERSITE=1, whatever the profile says."""
    import subprocess
    import sys
    import sysconfig

    bare = os.path.join(sys.base_prefix, "bin", "python3")
    version = sysconfig.get_python_version()
    site = tmp_path / "home" / ".local" / "lib" / f"python{version}" / "site-packages"
    site.mkdir(parents=True)
    marker = tmp_path / "ran"
    (site / "usercustomize.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    env = childenv.child_env({"HOME": str(tmp_path / "home"), "PYTHONNOUSERSITE": ""})
    assert env["PYTHONNOUSERSITE"] == "1"
    subprocess.run([bare, "-c", "pass"], env=env, check=True)
    assert not marker.exists()
    subprocess.run([bare, "-c", "pass"], env={**env, "PYTHONNOUSERSITE": ""}, check=True)
    assert marker.exists(), "the check itself: without the variable the user site runs"


@pytest.fixture
def tree(tmp_path):
    """A module tree root trusts: a package with a module, and a foreign tree beside it."""
    root = tmp_path / "site"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "mod.py").write_text("")
    foreign = tmp_path / "foreign" / "pkg2" / "sub"
    foreign.mkdir(parents=True)
    (foreign / "m.py").write_text("")
    return root, foreign


def _refused(root) -> str:
    with pytest.raises(trust.Untrusted) as caught:
        trust.judge_tree(str(root), os.geteuid())
    return str(caught.value)


def test_a_module_file_others_can_change_is_refused_not_only_a_directory(tree):
    root, _ = tree
    assert trust.judge_tree(str(root), os.geteuid()) == 2
    module = root / "pkg" / "mod.py"
    module.chmod(0o666)
    said = _refused(root)
    assert f"{module} (owner uid 0, mode 0666) can be changed by another user" in said
    assert f"fix: chown root {module} && chmod go-w {module}" in said
    module.chmod(0o644)
    os.chown(module, 65534, 65534)
    assert f"{module} (owner uid 65534, mode 0644)" in _refused(root)


def test_a_linked_package_is_walked_into_its_target(tree):
    root, foreign = tree
    os.symlink(foreign.parent, root / "pkg2")  # site/pkg2 -> foreign/pkg2 (root's, fine)
    assert trust.judge_tree(str(root), os.geteuid()) == 4  # site, pkg, pkg2's target, sub
    os.chown(foreign, 65534, 65534)  # a subdirectory of the link's target: another user's
    assert f"{foreign} (owner uid 65534" in _refused(root)
    os.chown(foreign, 0, 0)
    os.symlink(root, root / "pkg" / "loop")  # a link back up: followed once, no loop
    assert trust.judge_tree(str(root), os.geteuid()) == 4


@pytest.fixture
def copied_venv(tmp_path):
    """A base installation and a `--copies` venv of it (executables are copies, not links:
    only pyvenv.cfg's home leads to the standard library CPython loads)."""
    base = tmp_path / "base"
    stdlib = base / "lib" / "python3.11"
    (stdlib / "encodings").mkdir(parents=True)
    (stdlib / "os.py").write_text("")
    (stdlib / "encodings" / "__init__.py").write_text("")
    (base / "bin").mkdir()
    (base / "bin" / "python3.11").write_bytes(b"\x7fELF-base")
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "lib" / "python3.11" / "site-packages").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text(
        f"home = {base / 'bin'}\ninclude-system-site-packages = false\n"
    )
    (venv / "bin" / "python3").write_bytes(b"\x7fELF-copy")
    return base, venv


def _problems(venv) -> list[str]:
    from gpufleet.control.agent import python_trust as judge
    from gpufleet.control.connect.local import LocalTree

    return judge.judge_python(str(venv / "bin" / "python3"), 0, LocalTree()).problems


def test_a_copied_venv_is_judged_by_the_standard_library_it_loads(copied_venv):
    base, venv = copied_venv
    assert _problems(venv) == []
    encodings = base / "lib" / "python3.11" / "encodings"
    encodings.chmod(0o777)  # imported at start-up, before any of gpufleet's code
    said = _problems(venv)
    assert any(f"{encodings} (owner uid 0, mode 0777)" in p for p in said), said


def test_a_pth_file_beside_the_executable_is_read_as_cpython_reads_it(copied_venv, tmp_path):
    _, venv = copied_venv
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    theirs.chmod(0o777)
    (venv / "bin" / "python3._pth").write_text(f"{theirs}\nimport site\n")
    said = _problems(venv)
    assert any(f"{theirs}" in p and "python3._pth" in p for p in said), said
    theirs.chmod(0o755)
    assert _problems(venv) == []


def test_every_relative_spelling_of_an_untrusted_path_is_found_from_where_it_starts(
    places, monkeypatch
):
    """Issue 68.2, the class: a value naming a library by a relative path (`../open/evil.so`,
    `./x/../../open/evil.so`) is read by its loader from the server's cwd; it is judged
    from there (the agent's cwd: where the server starts), however it is spelled. A word
    without a `/` is looked up on a search path, never in the directory, and is no path."""
    own, open_, _ = places
    monkeypatch.chdir(own)
    spellings = ["../open/evil.so", "./../open/evil.so", "../own/../open/evil.so",
                 "x/../../open/evil.so", f"../{open_.name}//evil.so"]  # fmt: skip
    for value in spellings:
        for shape in ("{}", "/usr/lib/a.so:{}", "--lib={}", "a.so {}"):
            said = childenv.refusals({"CUDA_INJECTION64_PATH": shape.format(value)})
            assert len(said) == 1 and str(open_) in said[0], (shape, value, said)
    assert childenv.refusals({"CUDA_INJECTION64_PATH": "./good.so"}) == []
    assert childenv.refusals({"CUDA_INJECTION64_PATH": "evil.so"}) == []  # a search-path name
