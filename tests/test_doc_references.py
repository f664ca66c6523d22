"""Docs that name things are checked (issue 82, bullet 7): every backticked path in docs/
and README.md is a file of the repository (or a file the code writes, or one of another
project's the docs say so of), every `path: name` and `file.py::test_name` names what
that module defines, and the README's sentence about which tasks take `--inventory` and
`--hosts` is the tasks' own options."""

from __future__ import annotations

import ast
import fnmatch
import re
from functools import cache
from pathlib import Path

from helpers import REPO

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# where a path the docs name is looked up: the repository, the package, the tests
BASES = [REPO, REPO / "src", REPO / "src" / "gpufleet", REPO / "tests"]
# a whole backticked span that is a path, with an optional `: name`, `:name` or `::name`
REFERENCE = re.compile(
    r"^(?P<path>[\w./*-]+\.(?:py|md|yaml|yml|sh|json|jsonl|toml|txt|csv))"
    r"(?:(?:::|:\s?)(?P<name>[A-Za-z_][\w.]*))?$"
)
# files of other projects the docs cite (SGLang's sources, Python's start-up files, the
# user's own inventory): none is ours to find here
ELSEWHERE = {
    "sglang/srt/entrypoints/http_server.py", "srt/arg_groups/speculative_hook.py",
    "srt/speculative/eagle_worker_v2.py", "speculative/eagle_worker_v2.py",
    "eagle_worker_v2.py", "adaptive_runtime_state.py", "adaptive_spec_params.py",
    "environ.py",  # SGLang's
    "hashlib.py", "os.py", "runpy.py", "sitecustomize.py", "usercustomize.py",  # Python's
    "pynvml.py",  # nvidia-ml-py's
    "modeling_*.py",  # a model checkpoint's code
    "hosts/fleet.yaml", "hosts/NAME.yaml",  # the user's inventory, copied from example.yaml
}  # fmt: skip


@cache
def _repo_files() -> list[str]:
    skip = {".git", ".venv", "__pycache__", "node_modules"}
    return [str(p.relative_to(REPO)) for p in REPO.rglob("*")
            if p.is_file() and not skip & set(p.parts)]  # fmt: skip


@cache
def _source_text() -> str:
    return "\n".join(p.read_text() for p in (REPO / "src" / "gpufleet").rglob("*.py"))


def _files(path: str) -> list[Path]:
    """The repository's files `path` (a glob allowed) names, relative to any base; a bare
    file name anywhere in the repository."""
    found = [h for b in BASES for h in (b.glob(path) if "*" in path else [b / path]) if h.exists()]
    if not found and "/" not in path:
        found = [REPO / f for f in _repo_files() if fnmatch.fnmatch(Path(f).name, path)]
    return found


def _written_by_the_code(path: str) -> bool:
    """A run's or a workdir's file (`summary.md`, `health/xids.json`): its name, up to the
    first wildcard or number, is spelled in the package's source."""
    if path.endswith(".py"):
        return False  # a module is a file of the repository or another project's
    literal = re.split(r"[*<0-9]", path.rsplit("/", 1)[-1], maxsplit=1)[0]
    return len(literal) > 3 and literal in _source_text()


def _defines(module: Path, dotted: str) -> bool:
    """Whether `module` defines `dotted` (a function, class or assignment; `Class.attr`)."""
    scope = ast.parse(module.read_text()).body
    for part in dotted.split("."):
        for node in scope:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names = [node.name]
            elif isinstance(node, ast.Assign):
                names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names = [node.target.id]
            else:
                continue
            if part in names:
                scope = getattr(node, "body", [])
                break
        else:
            return False
    return True


def unresolved(text: str) -> list[str]:
    """The references in `text` that name nothing."""
    wrong = []
    for span in re.findall(r"`([^`\n]+)`", text):
        ref = REFERENCE.match(span.strip())
        if ref is None or "<" in span:
            continue
        path, name = ref.group("path"), ref.group("name")
        if path in ELSEWHERE:
            continue
        files = _files(path)
        if not files and not (name is None and _written_by_the_code(path)):
            wrong.append(f"{span}: no such file")
        elif name and path.endswith(".py") and not any(_defines(f, name) for f in files):
            wrong.append(f"{span}: {path} defines no {name}")
    return wrong


def test_every_path_and_name_the_docs_give_exists():
    """Issue 82: docs/PROFILES.md named `_llamacpp_gpus` after it moved, ARCHITECTURE.md
    `fleet/estimate.py: SPREAD` and a `main.py` that is `dispatch.py`, RELIABILITY.md
    `cli/args.py: EXPECTED` and a test renamed since; every such reference now resolves."""
    wrong = [f"{doc.relative_to(REPO)}: {w}" for doc in DOCS for w in unresolved(doc.read_text())]
    assert wrong == [], "\n".join(wrong)


def test_the_reference_check_finds_what_is_not_there():
    """The check fails where it should: a moved file, a renamed function, a test that is
    gone; it passes a file the code writes and a placeholder."""
    assert unresolved("`control/connect/base.py: Session`") == []
    assert unresolved("`tests/test_doc_references.py::test_the_reference_check_finds_what_is_not_there`") == []  # fmt: skip
    assert unresolved("`summary.md`, `logs/<host>/x.json`, `hosts/rehearsal.yaml`") == []
    assert unresolved("`control/connect/gone.py`") == ["control/connect/gone.py: no such file"]
    assert unresolved("`fleet/estimate.py: SPREAD`") == [
        "fleet/estimate.py: SPREAD: fleet/estimate.py defines no SPREAD"
    ]
    assert len(unresolved("`test_bench.py::test_that_never_was`")) == 1
    assert unresolved("`main.py`") == ["main.py: no such file"]


def _takes(option: str) -> set[str]:
    """The tasks with this option: a parameter of the task's body, as Invoke reads it."""
    import inspect

    from gpufleet.cli.tasks import ns

    return {n for n in ns.task_names if option in inspect.signature(ns[n].body).parameters}


def test_the_readme_says_which_tasks_take_inventory_and_hosts():
    """Issue 82: README.md and docs/USAGE.md said every task takes `--inventory` and
    `--hosts`; 8 of 19 do not. Their sentence names the tasks, and the names are the tasks'
    own options: those that reach hosts take both, `hosts` the inventory alone, `compare`
    and `report` a `--hosts` of the archive's hosts."""
    both = _takes("inventory") & _takes("hosts")
    for doc in (REPO / "README.md", REPO / "docs" / "USAGE.md"):
        text = " ".join(doc.read_text().split())
        said = re.search(r"The tasks that reach hosts \(([^)]*)\) take `--inventory", text)
        assert said, f"{doc.name}: no sentence naming the tasks that take --inventory"
        assert set(re.findall(r"`([a-z-]+)`", said.group(1))) == both, doc.name
        alone = re.search(r"`([a-z-]+)` takes `--inventory` alone", text)
        assert alone and {alone.group(1)} == _takes("inventory") - _takes("hosts"), doc.name
        archive = re.search(r"((?:`[a-z-]+`(?:,| and) )+`[a-z-]+`) take `--hosts` to keep", text)
        assert archive, f"{doc.name}: no sentence naming the tasks whose --hosts filters runs"
        named = set(re.findall(r"`([a-z-]+)`", archive.group(1)))
        assert named == _takes("hosts") - _takes("inventory"), doc.name


def test_the_verb_contract_says_which_answers_are_records():
    """Issue 82: docs/ARCHITECTURE.md and host/agent/protocol.py said every answer is a
    TypedDict; answers are records now (a verb's `ANSWER`). The section names the TypedDicts
    left, exactly, and only records that some verb declares."""
    import typing

    from gpufleet.host.agent import protocol

    text = (REPO / "docs" / "ARCHITECTURE.md").read_text()
    section = text[text.index("## The verb contract") :]
    section = " ".join(section[: section.index("\n## ", 3)].split())
    named = set(re.findall(r"`(\w+Answer)`", section))
    typed_dicts = {
        name for name, value in vars(protocol).items()
        if name.endswith("Answer") and typing.is_typeddict(value)
    }  # fmt: skip
    records = {cls.ANSWER.__name__ for cls in _verb_classes(protocol) if cls.ANSWER is not None}
    assert typed_dicts <= named, typed_dicts - named
    assert named - typed_dicts <= records, named - typed_dicts - records
    assert (
        "answer TypedDict." not in section
        and "`*Answer` TypedDicts."
        not in (REPO / "src/gpufleet/host/agent/protocol.py").read_text()
    )


def _verb_classes(protocol) -> list[type]:
    found, todo = [], [protocol.VerbArgs]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo += cls.__subclasses__()
    return found
