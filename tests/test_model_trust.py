"""Issue 50, bullet 5: a root server loads its model, and with remote code trusted runs the
model's own Python. A model path (or a draft's, by its adapter's flag) that another user can
write, and the model's `*.py` where remote code runs, are refused before launch, in one line
with path, owner, mode and fix; `python_trust: warn` runs it and says so; a model only root
controls is neither refused nor warned about. Before this, every case here launched."""

from __future__ import annotations

import os

import pytest
import yaml

from helpers import run_cli

NOBODY = 65534


@pytest.fixture
def host(tmp_path):
    """A local host without GPUs and a llama-server that only answers its version probe."""
    program = tmp_path / "llama-server"
    program.write_text("#!/bin/sh\necho 'version: 42 (test)' >&2\n")
    program.chmod(0o755)
    models = tmp_path / "models"
    models.mkdir(mode=0o755)

    def inventory(trust: str = "refuse"):
        path = tmp_path / f"cpu-{trust}.yaml"
        path.write_text(yaml.safe_dump({"hosts": {"cpu1": {
            "connection": "local", "python": "auto", "workdir": str(tmp_path / "work"),
            "python_trust": trust, "gpus": {"count": 0}}}}))  # fmt: skip
        return path

    return tmp_path, program, models, inventory


def dry_run(tmp_path, program, trust_inventory, model, **profile):
    path = tmp_path / "llama.yaml"
    path.write_text(yaml.safe_dump({
        "engine": "llamacpp", "model_path": str(model), "port": 18997,
        "command": [str(program), "-m", "{model_path}", "--port", "{port}"],
        "check_flags": False, **profile,
    }))  # fmt: skip
    out = run_cli("launch", "--profile", str(path), "--inventory", str(trust_inventory),
                  "--dry-run")  # fmt: skip
    return out.returncode, out.stdout + out.stderr


def test_a_model_others_can_write_is_refused_and_a_trusted_one_is_not(host):
    tmp_path, program, models, inventory = host
    good = models / "good.gguf"
    good.write_bytes(b"GGUF")
    code, said = dry_run(tmp_path, program, inventory(), good)
    assert code == 0 and "model path" not in said, said  # silent where nothing is wrong

    open_dir = models / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    (open_dir / "m.gguf").write_bytes(b"GGUF")
    code, said = dry_run(tmp_path, program, inventory(), open_dir / "m.gguf")
    assert code == 1, said
    assert f"model path {open_dir}/m.gguf: {open_dir} (owner uid 0, mode 0777)" in said, said
    assert f"fix: chmod go-w {open_dir}" in said, said

    theirs = models / "theirs.gguf"
    theirs.write_bytes(b"GGUF")
    os.chown(theirs, NOBODY, NOBODY)
    code, said = dry_run(tmp_path, program, inventory(), theirs)
    assert code == 1 and f"{theirs} (owner uid {NOBODY}" in said, said

    # the draft the adapter's flag names is loaded too
    code, said = dry_run(tmp_path, program, inventory(), good,
                         flags={"model-draft": str(open_dir / "m.gguf")})  # fmt: skip
    assert code == 1 and f"model path {open_dir}/m.gguf" in said, said


def test_python_trust_warn_runs_an_untrusted_model_and_says_so(host):
    tmp_path, program, models, inventory = host
    open_dir = models / "shared"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    code, said = dry_run(tmp_path, program, inventory("warn"), open_dir)
    assert code == 0, said
    assert "loading an untrusted model (python_trust: warn): model path" in said, said


def test_remote_code_judges_every_file_of_the_model_and_only_then(host):
    """With remote code trusted the server imports the model's `*.py`: a file another user
    can change inside a directory only root controls is refused; without remote code the
    same file is never run, and the launch is not refused for it."""
    tmp_path, program, models, inventory = host
    model = models / "hf"
    model.mkdir()
    (model / "config.json").write_text("{}")
    code_file = model / "modeling_x.py"
    code_file.write_text("import os\n")
    code_file.chmod(0o666)
    code, said = dry_run(tmp_path, program, inventory(), model)
    assert code == 0 and "model path" not in said, said

    sglang = tmp_path / "sg.yaml"
    for trusted, refused in ((True, True), (False, False)):
        sglang.write_text(yaml.safe_dump({"model_path": str(model), "port": 18996,
                                          "flags": {"trust-remote-code": trusted}}))  # fmt: skip
        out = run_cli("launch", "--profile", str(sglang), "--inventory", str(inventory()),
                      "--dry-run")  # fmt: skip
        text = out.stdout + out.stderr
        assert out.returncode == 1  # no GPU on this host, no SGLang installed
        assert ("its remote code runs as root" in text) is refused, text
        if refused:
            assert f"{code_file} (owner uid 0, mode 0666) can be changed by another user" in text


def _their_model(models, name: str):
    """A model directory another user owns, with its own Python."""
    theirs = models / name
    theirs.mkdir()
    (theirs / "modeling.py").write_text("print('their code')\n")
    os.chown(theirs, NOBODY, NOBODY)
    os.chown(theirs / "modeling.py", NOBODY, NOBODY)
    return theirs


def test_every_model_path_wherever_spelled_is_judged_issue_68_3(host):
    """A vLLM draft inside `--speculative-config` JSON, trust-remote-code in the engine's
    config file, and a custom command carrying `--trust-remote-code` all launched as root
    unjudged; SGLang's draft flag with the same directory was refused."""
    import json

    tmp_path, program, models, inventory = host
    good = models / "good"
    good.mkdir()
    draft = _their_model(models, "draft")
    # vLLM: the draft named inside a flag's JSON
    code, said = dry_run(tmp_path, program, inventory(), good, engine="vllm",
                         flags={"speculative-config": json.dumps(
                             {"model": str(draft), "num_speculative_tokens": 3})})  # fmt: skip
    assert code == 1 and f"model path {draft}" in said, said
    # a config file that trusts remote code and names the model: the tree is judged
    theirs = _their_model(models, "theirs")
    config = tmp_path / "engine.yaml"
    config.write_text(f"model-path: {theirs}\ntrust_remote_code: true  # from the docs\n")
    code, said = dry_run(tmp_path, program, inventory(), good, flags={"config": str(config)})
    assert code == 1 and str(theirs) in said, said
    # a custom command that trusts remote code: its paths cannot be found, so as root no
    custom = tmp_path / "custom.yaml"
    custom.write_text(yaml.safe_dump({
        "engine": "custom", "model_path": str(good), "port": 18996, "check_model_path": False,
        "command": [str(program), "--model", "{model_path}", "--trust-remote-code"],
        "check_flags": False,
    }))  # fmt: skip
    out = run_cli("launch", "--profile", str(custom), "--inventory", str(inventory()),
                  "--dry-run")  # fmt: skip
    assert out.returncode == 1, out.stdout + out.stderr
    assert "runs its model's own Python (--trust-remote-code) as root, and gpufleet cannot " \
           "find every model path" in out.stderr, out.stderr  # fmt: skip
    warned = run_cli("launch", "--profile", str(custom), "--inventory",
                     str(inventory("warn")), "--dry-run")  # fmt: skip
    assert warned.returncode == 0 and "python_trust: warn" in warned.stdout + warned.stderr
