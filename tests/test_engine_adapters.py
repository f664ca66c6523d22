"""Engine adapters (issue 38): each engine's facts in one place (control/server/engines.py), turned
into the launch spec's probes and facts, the bench's default dialect and its warning where
a level is above the requests the server serves at once."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from gpufleet.control.bench.run import engine_backend, queueing_warning
from gpufleet.control.inventory.model import Host
from gpufleet.control.server import engines
from gpufleet.control.server.profiles import Profile, build_specs


def _spec(tmp_path, **fields):
    profile = Profile(name="p", model_path=str(tmp_path), **fields)
    host = Host(name="h", connection="local", gpus={"count": 0})
    [(_, spec)] = build_specs(profile, [host])
    return spec


def test_each_engine_fills_its_probes_and_facts(tmp_path):
    llama = _spec(tmp_path, engine="llamacpp", flags={"parallel": 4, "model-draft": "d.gguf",
                                                      "spec-type": "draft-simple"})  # fmt: skip
    assert llama.argv[:3] == ["llama-server", "-m", str(tmp_path)]
    assert llama.version_argv == ["llama-server", "--version"]
    assert llama.help_argv == ["llama-server"] and llama.flags_from == 1
    assert llama.slots == 4 and llama.needs_gpu is False and llama.gpus == []
    vllm = _spec(tmp_path, engine="vllm", flags={"max-num-seqs": 64})
    assert vllm.help_argv == ["vllm", "serve", str(tmp_path)] and vllm.slots == 64
    assert vllm.needs_gpu is True
    custom = _spec(tmp_path, engine="custom", command=["my-server", "--port", "{port}"])
    assert custom.version_argv == [] and custom.help_argv == []  # nothing asked unless said
    checked = _spec(tmp_path, engine="custom", command=["my-server", "--port", "{port}"],
                    version_command=["my-server", "-V"], check_flags=True)  # fmt: skip
    assert checked.version_argv == ["my-server", "-V"] and checked.help_argv == ["my-server"]
    sglang = _spec(tmp_path, engine="sglang", flags={"speculative-algorithm": "EAGLE3"})
    assert sglang.slots == 48  # SGLang's silent EAGLE cap
    # a module engine is asked with the server's own Python: --help of its module, the
    # version of its distribution, and its renames and --config come from its adapter
    python = sglang.argv[0]
    assert sglang.help_argv == [python, "-m", "sglang.launch_server"] and sglang.flags_from == 3
    assert sglang.version_argv[:2] == [python, "-c"] and "'sglang'" in sglang.version_argv[2]
    assert sglang.version_missing.startswith("has no sglang installed")
    assert {r["old"] for r in sglang.renames} == {
        "--cuda-graph-max-bs",
        "--enable-flashinfer-allreduce-fusion",
    }
    assert sglang.takes_config and not llama.takes_config and not llama.renames
    sim = _spec(tmp_path, engine="sim")
    assert sim.version and sim.version.startswith("gpufleet-sim ") and sim.version_argv == []
    assert sim.help_argv == [sim.argv[0], "-m", "gpufleet.sim.server"]


@pytest.mark.parametrize(
    ("flags", "on_gpu"),
    [({"n-gpu-layers": 99}, True), ({"ngl": 10}, True), ({"n-gpu-layers": 0}, False), ({}, False)],
)
def test_llama_cpp_with_layers_on_the_gpu_is_checked_and_verified_as_a_gpu_server(
    tmp_path, flags, on_gpu
):
    """Issue 54: llama-server with every layer on the H200 held 1,046 MiB, but its launch
    spec named no GPU, so `stop` verified nothing and the next sweep cell's gpu-clean found
    the memory still being released. With layers on the GPU the spec claims the GPUs (every
    one it sees, by llama.cpp's default split: the host lists them, issue 65.1)."""
    spec = _spec(tmp_path, engine="llamacpp", flags={"parallel": 4, **flags})
    assert spec.gpus == [] and spec.gpus_every is on_gpu and spec.needs_gpu is on_gpu


def test_what_a_profile_drafts_with_in_its_engines_words(tmp_path):
    def drafts(engine, flags):
        return Profile(name="p", engine=engine, model_path="m", flags=flags,
                       command=["x"] if engine == "custom" else None).speculative_algorithm  # fmt: skip

    assert drafts("sglang", {"speculative-algorithm": "EAGLE3"}) == "EAGLE3"
    assert drafts("llamacpp", {"model-draft": "d.gguf", "spec-type": "draft-simple"}) == (
        "draft model (draft-simple)"
    )
    # llama.cpp loads a draft and never uses it without --spec-type (REFERENCE.md): said
    assert drafts("llamacpp", {"model-draft": "d.gguf"}) == "draft model (no --spec-type: unused)"
    assert drafts("vllm", {"speculative-config": '{"method": "eagle3"}'}).startswith("{")
    assert drafts("llamacpp", {}) is None and drafts("custom", {}) is None


def test_a_bench_speaks_the_profiles_engine_dialect_unless_told(tmp_path, monkeypatch):
    (tmp_path / "playbooks").mkdir()
    (tmp_path / "playbooks" / "llama.yaml").write_text(
        yaml.safe_dump({"engine": "llamacpp", "model_path": "/m.gguf"})
    )
    (tmp_path / "playbooks" / "sg.yaml").write_text(yaml.safe_dump({"model_path": "/m"}))
    monkeypatch.chdir(tmp_path)
    assert engine_backend("llama") == "openai"
    assert engine_backend("sg") == "sglang"
    assert engine_backend(None) == "sglang" and engine_backend("missing") == "sglang"


@pytest.mark.parametrize(
    ("levels", "slots", "engine", "said"),
    [
        ([1, 2, 4, 8], 4, "llamacpp", "C=8 above the 4 requests the server serves at once "
                                      "(--parallel)"),
        ([1, 64], 48, "sglang", "C=64 above the 48 requests the server serves at once "
                                "(--max-running-requests)"),
        ([1, 2, 4], 4, "llamacpp", None),  # every level fits: silent
        ([1, 64], None, "llamacpp", None),  # nobody knows the slots (--parallel auto): silent
    ],
)  # fmt: skip
def test_the_queueing_warning_fires_only_above_the_slots(levels, slots, engine, said):
    got = queueing_warning(levels, slots, engine)
    assert (got is None) if said is None else (got is not None and got.startswith(said))


def test_every_engine_a_profile_may_name_has_an_adapter():
    """The names a profile may give are the registry's, listed nowhere else (issue 66):
    each is accepted, anything else refused with the registry's names, and the --backend
    help says every engine's dialect."""
    import pydantic

    from gpufleet.cli.common_options import request_options

    for name in engines.NAMES:
        assert Profile(name="p", model_path="/m", engine=name, command=["x"]).engine == name
    with pytest.raises(pydantic.ValidationError) as refused:
        Profile(name="p", model_path="/m", engine="tgi")
    assert all(f"'{name}'" in str(refused.value) for name in engines.NAMES)
    help_text = request_options().help()["backend"]  # the field's help and its default
    assert all(name in help_text for name in engines.NAMES)


def test_a_bench_above_the_servers_slots_says_so_and_only_there(fleet):
    profile = fleet.profile("capped", flags={"max-running-requests": 2})
    out = fleet.cli("launch", "--profile", str(profile), "--hosts", "h0")
    assert out.returncode == 0, out.stdout + out.stderr
    try:
        over = fleet.cli("bench", "--profile", "capped", "--hosts", "h0", "--concurrency",
                         "1,4", "--num-prompts", "4", "--output-len", "4")  # fmt: skip
        assert over.returncode == 0, over.stdout + over.stderr
        assert re.search(r"h0: warning: C=4 above the 2 requests the server serves at once "
                         r"\(--max-running-requests\)", over.stdout), over.stdout  # fmt: skip
        within = fleet.cli("bench", "--profile", "capped", "--hosts", "h0", "--concurrency",
                           "1,2", "--num-prompts", "4", "--output-len", "4")  # fmt: skip
        assert within.returncode == 0 and "requests the server serves at once" not in within.stdout
    finally:
        fleet.cli("stop", "--hosts", "h0")


def test_a_host_without_gpus_is_said_and_a_cpu_engine_needs_none(tmp_path):
    """Issue 38 item 8: a CPU-only host had to claim simulated GPUs to get past gpu-clean
    (and then recorded their idle power as the server's energy)."""
    from helpers import run_cli

    inventory = tmp_path / "cpu.yaml"
    inventory.write_text(yaml.safe_dump({"hosts": {"cpu1": {
        "connection": "local", "python": "auto", "workdir": str(tmp_path / "work"),
        "gpus": {"count": 0}}}}))  # fmt: skip
    clean = run_cli("gpu-clean", "--inventory", str(inventory))
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert "cpu1: no GPUs (the inventory gives it `gpus: {count: 0}`): nothing to clean" in (
        clean.stdout
    )
    program = tmp_path / "llama-server"
    program.write_text("#!/bin/sh\necho 'version: 42 (test)' >&2\n")
    program.chmod(0o755)
    profile = tmp_path / "llama.yaml"
    profile.write_text(yaml.safe_dump({
        "engine": "llamacpp", "model_path": str(tmp_path), "port": 18999,
        "command": [str(program), "-m", "{model_path}", "--port", "{port}"],
        "check_flags": False,
    }))  # fmt: skip
    dry = run_cli("launch", "--profile", str(profile), "--inventory", str(inventory), "--dry-run")
    assert dry.returncode == 0, dry.stdout + dry.stderr  # no GPU asked for, none checked
    sglang = profile.with_name("sg.yaml")
    sglang.write_text(yaml.safe_dump({"model_path": str(tmp_path), "port": 18998}))
    refused = run_cli("launch", "--profile", str(sglang), "--inventory", str(inventory),
                      "--dry-run")  # fmt: skip
    assert refused.returncode == 1  # a GPU engine on it still needs what it lacks


def test_a_server_that_cannot_empty_its_cache_gets_prompts_of_each_levels_own(
    tmp_path, monkeypatch
):
    """Issue 38 item 3: llama-server has no /flush_cache, and every level sent the same
    first prompts: its prompt cache served 100% of prompt tokens from C=2 on (the tier)."""
    from gpufleet.control.bench.request import BenchRequest
    from gpufleet.control.bench.run import build_plan
    from gpufleet.host.bench.level import Prompt, salted

    (tmp_path / "playbooks").mkdir()
    (tmp_path / "playbooks" / "llama.yaml").write_text(
        yaml.safe_dump({"engine": "llamacpp", "model_path": "/m.gguf"})
    )
    (tmp_path / "playbooks" / "sg.yaml").write_text(yaml.safe_dump({"model_path": "/m"}))
    monkeypatch.chdir(tmp_path)

    def plan(profile, flush=True):
        request = BenchRequest(concurrency=[1, 2], profile=profile, flush_cache=flush,
                               prompts="random", num_prompts=2)  # fmt: skip
        return build_plan(request, "20261202T000000Z-x-abc123")[0]

    assert plan("llama").salt_prompts is True
    assert plan("sg").salt_prompts is False  # SGLang empties its cache: prompts as they are
    assert plan("llama", flush=False).salt_prompts is False  # --no-flush: the cache is wanted
    prompts = [Prompt(text="shared prefix, then a"), Prompt(text="shared prefix, then b"),
               Prompt(input_ids=[5, 6, 7])]  # fmt: skip
    one, two = salted(prompts, "[abc123 c1] "), salted(prompts, "[abc123 c2] ")
    assert one[0].text == "[abc123 c1] shared prefix, then a" and one[2].input_ids == [5, 6, 7]
    assert one[0].text != two[0].text  # no level's prompt is another's
    assert one[0].text[:25] == one[1].text[:25]  # within a level, the shared part stays shared


def test_a_grid_or_tune_cell_benches_in_its_own_engines_dialect(tmp_path, monkeypatch):
    """Issue 38: a cell's request is named by its label (`llama[depth=1]`), which is no
    profile file: its engine was looked up by that name, not found, and every tune cell on
    llama-server posted SGLang's /generate (404) with prompts unsalted. The cell now carries
    its resolved profile's engine, and the static cell of a tune (the profile as written)
    runs under its own label."""
    from gpufleet.control.bench.request import BenchRequest
    from gpufleet.control.bench.run import build_plan
    from gpufleet.control.server.host_options import LaunchOptions
    from gpufleet.control.sweep.cells import ArmSpec
    from gpufleet.control.sweep.sweep_cell import cell_request

    (tmp_path / "playbooks").mkdir()
    (tmp_path / "playbooks" / "llama.yaml").write_text(yaml.safe_dump({
        "engine": "llamacpp", "model_path": "/m.gguf",
        "flags": {"model-draft": "/d.gguf", "spec-type": "draft-simple"}}))  # fmt: skip
    monkeypatch.chdir(tmp_path)
    request = BenchRequest(concurrency=[1], prompts="random", num_prompts=2)
    for arm in (ArmSpec("llama", {"spec-draft-n-max": 1}, 1, "llama[depth=1]"),
                ArmSpec("llama", {}, 1, "llama-static")):  # fmt: skip
        cell = cell_request(request, arm, LaunchOptions())
        assert cell.profile == arm.label and cell.server_engine == "llamacpp"
        plan = build_plan(cell, "20261202T000000Z-x-abc123")[0]
        assert plan.backend == "openai" and plan.salt_prompts is True
        assert arm.resolved_profile().name == arm.label
    rehearsed = cell_request(request, ArmSpec("llama", {}, 1, "llama"), LaunchOptions(engine="sim"))
    assert build_plan(rehearsed, "20261202T000000Z-x-abc123")[0].backend == "sglang"


ENGINE_WORDS = re.compile(
    r"sglang\.launch_server|llama-server|spec-draft|model-draft|spec-type|max-running-requests|"
    r"max-num-seqs|speculative-algorithm|speculative-config|metadata\.version\('sglang'\)|"
    r"llamacpp:|vllm:"
)
# where an engine's own words may appear in code, and why
ENGINE_WORDS_ALLOWED = {
    "control/server/engines.py": "the adapters themselves",
    "control/server/llamacpp.py": "the llama.cpp adapter's flag readings, apart for length",
    "sim/": "the rehearsal engine imitates SGLang, flags and all",
    "engine_facts.py": "SGLang's facts that both the tuner and the rehearsal engine read",
    "control/tune/table.py": "SGLang's adaptive table, written where its adapter says adaptive",
    "control/tune/files.py": "the same table's files",
    "report/compare.py": "runs archived before the adapters read SGLang's cap from argv",
}


def test_an_engines_knowledge_lives_in_its_adapter():
    """A census (issue 38): no string in code (docstrings and comments aside) names an
    engine's program, module or flags outside its adapter, but where the list above says
    why. SGLang's module probes, flag renames, adaptive refusals and EAGLE cap were spread
    over preflight, flagrenames and playbook; the next such string fails here."""
    import ast

    src = Path(__file__).resolve().parents[1] / "src" / "gpufleet"
    found = []
    for path in sorted(src.rglob("*.py")):
        name = path.relative_to(src).as_posix()
        if any(name.startswith(allowed) for allowed in ENGINE_WORDS_ALLOWED):
            continue
        tree = ast.parse(path.read_text())
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and node.body and isinstance(node.body[0], ast.Expr)
        }  # fmt: skip
        for node in ast.walk(tree):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                    and id(node) not in docstrings and ENGINE_WORDS.search(node.value)):  # fmt: skip
                found.append(f"{name}:{node.lineno}: {node.value[:60]!r}")
    assert not found, found


@pytest.mark.parametrize(
    ("cmdline", "name", "stale"),
    [
        (["/opt/llama/bin/llama-server", "-m", "t.gguf"], "llama-server", True),
        (["python3", "-m", "sglang.launch_server", "--port", "30000"], "python3", True),
        (["sglang::scheduler_TP0"], "python3", True),
        (["python3", "-m", "gpufleet.sim.server"], "python3", True),
        (["bash", "-c", "llama-server -m t.gguf"], "bash", False),  # mentions it, runs bash
        (["less", "llama-server.log"], "less", False),
        (["/usr/bin/llama-server-wrapper"], "llama-server-wr", False),
    ],
)  # fmt: skip
def test_gpu_clean_looks_for_every_engines_processes_from_its_adapter(cmdline, name, stale):
    """Issue 38: gpu-clean's default patterns were SGLang's and the rehearsal's, in the host
    agent; each adapter now names its own processes and the control sends them."""
    from gpufleet.host.proc import identity
    from gpufleet.host.proc.gpuprocs import compile_patterns

    regexes = compile_patterns(engines.process_patterns())
    assert identity.matches(regexes, cmdline, name) is stale
