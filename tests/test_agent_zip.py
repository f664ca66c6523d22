"""The agent's zip carries each module's compiled code (control/agent/bundle.py): the same
bytes from any process of this Python, used by the bootstrap and by zipimport only where
this Python compiled these very sources, and built once per version into the user's cache."""

from __future__ import annotations

import importlib.util
import io
import os
import subprocess
import sys
import zipfile

from gpufleet.control.agent import bundle
from helpers import REPO

DIGEST = "from gpufleet.control.agent import bundle; print(bundle.build().digest)"
# a process that imported the control plane, the agent and the rehearsal first: format 4's
# back-references followed those imports' reference counts, and the digest moved with them
BUSY = (
    "import gpufleet.cli.tasks, gpufleet.host.registry, gpufleet.sim.server, "
    "gpufleet.report.tables\n" + DIGEST
)


def _digest(code: str, cache: os.PathLike, seed: str) -> str:
    env = dict(os.environ, XDG_CACHE_HOME=str(cache), PYTHONHASHSEED=seed)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, cwd=REPO, check=True)  # fmt: skip
    return out.stdout.strip()


def test_the_zip_is_the_same_bytes_whatever_the_process_imported_before(tmp_path):
    """The file name carries the hash, so each host receives a version once: a digest that
    moved with what the building process had imported would upload the agent again."""
    quiet = _digest(DIGEST, tmp_path / "a", "1")
    assert _digest(BUSY, tmp_path / "b", "2") == quiet
    assert _digest(BUSY, tmp_path / "a", "3") == quiet  # from the cache, as built


def test_every_module_travels_with_its_compiled_code():
    names = set(zipfile.ZipFile(io.BytesIO(bundle.build().data)).namelist())
    sources = {n for n in names if n.endswith(".py")}
    assert len(sources) > 50 and {n + "c" for n in sources} == names - sources


def _archive(pyc_magic: bytes | None = None, pyc_source: bytes | None = None) -> bytes:
    """A zip whose module `m` says where its code came from: its pyc was compiled from
    other text than its .py (with the .py's hash in the header unless `pyc_source` says
    otherwise), so what runs tells which one was used."""
    source = b'WHERE = "source"\n'
    pyc = bundle.compiled("m.py", b'WHERE = "pyc"\n')
    pyc = (pyc_magic or pyc[:4]) + pyc[4:8] + importlib.util.source_hash(
        pyc_source or source
    ) + pyc[16:]  # fmt: skip
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        zf.writestr("__main__.py", "import m\nprint(m.WHERE, m.__file__)\n")
        zf.writestr("m.py", source)
        zf.writestr("m.pyc", pyc)
    return buffer.getvalue()


RUN_FROM_MEMORY = (
    "import sys\nns = {'__name__': 'bootstrap'}\nexec(sys.argv[1], ns)\n"
    "ns['run_from_memory'](sys.argv[2], open(sys.argv[2], 'rb').read())\n"
)


def _bootstrap_run(path) -> subprocess.CompletedProcess:
    """The zip at `path` run as the bootstrap runs the agent's, from its bytes."""
    return subprocess.run(
        [sys.executable, "-I", "-S", "-c", RUN_FROM_MEMORY, bundle.bootstrap_source(), str(path)],
        capture_output=True, text=True,
    )  # fmt: skip


def _through_bootstrap(tmp_path, data: bytes) -> str:
    path = tmp_path / "agent.pyz"
    path.write_bytes(data)
    out = _bootstrap_run(path)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def _through_zipimport(tmp_path, data: bytes) -> str:
    """How the agent's children (the bench runner, the telemetry sampler) import it."""
    path = tmp_path / "child.pyz"
    path.write_bytes(data)
    out = subprocess.run([sys.executable, "-I", str(path)], capture_output=True, text=True,
                         check=True)  # fmt: skip
    return out.stdout.strip()


def test_the_bootstrap_and_zipimport_run_the_pyc_this_python_compiled_from_that_source(
    tmp_path,
):
    data = _archive()
    said = _through_bootstrap(tmp_path, data)
    assert said == f"pyc {tmp_path / 'agent.pyz'}/m.py"
    assert _through_zipimport(tmp_path, data).startswith("pyc ")


def test_a_pyc_of_another_python_or_another_source_is_not_run(tmp_path):
    other_python = _archive(pyc_magic=b"\x00\x00\r\n")
    other_source = _archive(pyc_source=b'WHERE = "an older source"\n')
    assert _through_bootstrap(tmp_path, other_python).startswith("source ")
    assert _through_zipimport(tmp_path, other_python).startswith("source ")
    assert _through_bootstrap(tmp_path, other_source).startswith("source ")


def test_a_traceback_from_compiled_code_names_the_file_in_the_zip(tmp_path):
    source = b"def boom():\n    raise RuntimeError('here')\n"
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        zf.writestr("__main__.py", "import m\nm.boom()\n")
        zf.writestr("m.py", source)
        zf.writestr("m.pyc", bundle.compiled("m.py", source))
    path = tmp_path / "agent.pyz"
    path.write_bytes(buffer.getvalue())
    out = _bootstrap_run(path)
    assert out.returncode == 1
    assert f'File "{path}/m.py", line 2, in boom' in out.stderr


def test_a_build_is_kept_once_per_version_and_a_cache_that_cannot_be_written_only_costs_time(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    sources = [("__main__.py", b"pass\n"), ("a.py", b"A = 1\n")]
    first = bundle.cached_build(sources)
    (kept,) = (tmp_path / "cache" / "gpufleet").iterdir()
    assert kept.read_bytes() == first
    kept.write_bytes(b"as kept")
    assert bundle.cached_build(sources) == b"as kept"  # read back, not built again
    kept.write_bytes(first)
    for n in range(bundle.CACHE_KEPT + 3):
        bundle.cached_build([*sources, ("b.py", f"B = {n}\n".encode())])
    assert len(list((tmp_path / "cache" / "gpufleet").iterdir())) == bundle.CACHE_KEPT
    # a file where the cache's folder would be: built in memory, the same bytes
    (tmp_path / "blocked").write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "blocked"))
    assert bundle.cached_build(sources) == first
