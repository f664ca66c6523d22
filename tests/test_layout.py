"""The layout holds: every import is one the layers table allows (gpufleet/layers.py),
no cycles between modules or packages, the zipapp is host/ + sim/ and stdlib-only, and
docs/ARCHITECTURE.md's package table is the one generated from the table.

Lazy imports inside functions count too: they are imports all the same.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import zipfile
from pathlib import Path

from gpufleet import layers
from gpufleet.control.agent import bundle as agentzip
from gpufleet.host.agent.protocol import CONTRACT
from gpufleet.host.registry import VERBS

SRC = Path(__file__).resolve().parent.parent / "src"
PACKAGE = SRC / "gpufleet"
REPO = SRC.parent
TOP = {"gpufleet.__main__", "gpufleet.layers"}  # the console entry point, the table itself
# Modules of a separate process, never imported by the agent: the simulated server's HTTP
# app needs aiohttp, as SGLang's does (the host venv has it). Nothing imports it at module
# level (checked below), so the agent never depends on it.
SERVER_PROCESS_ONLY = {"gpufleet.sim.api": {"aiohttp"}}


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(SRC).with_suffix("").parts
        name = ".".join(p for p in parts if p != "__init__")
        out[name] = path
    return out


def _imports(name: str, path: Path, top_level_only: bool = False) -> list[tuple[str, int]]:
    """(imported module, line) for every import in the file; relative imports resolved."""
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    is_pkg = path.name == "__init__.py"
    out = []
    for node in nodes:
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = name.split(".") if is_pkg else name.split(".")[:-1]
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            out.append((base, node.lineno))
            out += [(f"{base}.{a.name}", node.lineno) for a in node.names]
    return out


def _internal_edges() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        for target, _ in _imports(name, path):
            if target in modules and target != name:
                graph[name].add(target)
    return graph


def _package(module: str) -> str:
    """The package a module lives in, as the layers table names it (`control/tune`), or
    the base module's own name (`wire`)."""
    path = _modules()[module].relative_to(PACKAGE)
    parts = list(path.parts[:-1])
    while parts and not (PACKAGE.joinpath(*parts) / "__init__.py").exists():
        parts.pop()  # sim/shim is a directory put on a path, part of sim/
    return "/".join(parts) or path.stem


def test_every_import_is_one_the_layers_table_allows():
    """A module imports its own package, the base, or a package its package's row lists;
    shipped code imports only the shipped base; the base imports only the base."""
    wrong = []
    for source, targets in _internal_edges().items():
        if source in TOP:
            continue
        src_pkg = _package(source)
        for target in targets:
            dst_pkg = _package(target)
            if dst_pkg == src_pkg:
                continue
            if dst_pkg in layers.BASE:
                if src_pkg in layers.SHIPPED and dst_pkg not in layers.SHIPPED_BASE:
                    wrong.append(f"{source} -> {target} (shipped code imports the control plane)")
                continue
            if src_pkg in layers.BASE or dst_pkg not in layers.LAYERS.get(src_pkg, ()):
                wrong.append(f"{source} -> {target} ({src_pkg} may not import {dst_pkg})")
    assert not wrong, "imports the layers table does not allow:\n" + "\n".join(sorted(wrong))


def test_every_package_has_a_row_and_a_docstring():
    """A new package says where it sits, and what it owns, before anything imports it."""
    packages = {_package(m) for m in _modules() if m not in TOP}
    packages -= set(layers.BASE) | {"errors"}
    assert packages == set(layers.LAYERS), packages ^ set(layers.LAYERS)
    for package in packages:
        doc = ast.get_docstring(ast.parse((PACKAGE / package / "__init__.py").read_text()))
        assert doc and len(doc) > 40, f"{package}/__init__.py says nothing of what it owns"


def test_the_packages_form_no_cycle():
    """Rows only point at rows declared above them: layers, not a web."""
    seen: set[str] = set()
    for package, allowed in layers.LAYERS.items():
        later = [p for p in allowed if p not in seen]
        assert not later, f"{package} may import {later}, declared after it"
        seen.add(package)


def test_the_architecture_table_is_generated_from_the_layers_table():
    out = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "architecture.py"), "--check"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr


def test_no_import_cycles():
    graph = _internal_edges()
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append([*stack[stack.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt, stack)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [])
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_the_zipapp_ships_host_and_sim_whole_and_nothing_else():
    shipped = {name for name, _ in agentzip.shipped_files()}
    base = {f"gpufleet/{name}.py" for name in layers.SHIPPED_BASE}
    outside = sorted(n for n in shipped if n not in base and n.split("/")[1] not in ("host", "sim"))
    assert not outside, f"shipped from outside host/ and sim/: {outside}"
    expected = {
        f"gpufleet/{p.relative_to(PACKAGE).as_posix()}"
        for pkg in ("host", "sim")
        for p in (PACKAGE / pkg).rglob("*.py")
    }
    assert expected <= shipped, f"not shipped: {sorted(expected - shipped)}"


def test_shipped_modules_import_only_the_stdlib_at_import_time():
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    offenders = []
    for name, path in _modules().items():
        if name in TOP or _package(name) not in layers.SHIPPED:
            continue
        for target, line in _imports(name, path, top_level_only=True):
            root = target.split(".")[0]
            if root == "gpufleet":
                continue  # checked by the layering test
            if root not in stdlib and root not in SERVER_PROCESS_ONLY.get(name, set()):
                offenders.append(f"{path.relative_to(SRC)}:{line} imports {target}")
            if target in SERVER_PROCESS_ONLY:
                offenders.append(f"{path.relative_to(SRC)}:{line} imports {target} eagerly")
    assert not offenders, "\n".join(offenders)


def test_every_shipped_module_imports_from_the_zipapp_without_site_packages(tmp_path):
    """The real check: the built zipapp, a Python with no site-packages (`-S -I`)."""
    bundle = agentzip.build()
    pyz = tmp_path / bundle.filename
    pyz.write_bytes(bundle.data)
    names = [
        n[: -len(".py")].replace("/", ".").removesuffix(".__init__")
        for n in zipfile.ZipFile(pyz).namelist()
        if n.endswith(".py") and not n.endswith("__main__.py") and "/shim/" not in n
    ]
    names = [n for n in names if n not in SERVER_PROCESS_ONLY]
    code = f"import sys, importlib; sys.path.insert(0, {str(pyz)!r})\n" + "".join(
        f"importlib.import_module({n!r})\n" for n in names
    )
    out = subprocess.run([sys.executable, "-S", "-I", "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert len(names) > 20


def test_the_verb_registry_is_the_contract():
    assert set(VERBS) == set(CONTRACT)


def _module_aliases(tree: ast.Module) -> dict[str, str]:
    """Names bound to a gpufleet module by an import (`from gpufleet.x import y as z`)."""
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("gpufleet"):
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                if _is_module(full):
                    aliases[alias.asname or alias.name] = full
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("gpufleet") and alias.asname:
                    aliases[alias.asname] = alias.name
    rebound = {
        n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
    }
    rebound |= {a.arg for n in ast.walk(tree) if isinstance(n, ast.arguments)
                for a in [*n.args, *n.kwonlyargs, *n.posonlyargs]}  # fmt: skip
    return {name: full for name, full in aliases.items() if name not in rebound}


def _is_module(name: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def test_every_module_attribute_named_exists():
    """A census for moves (issue 49): every `alias.name` where the alias is a gpufleet module
    names something that module has, in src/, tests/ and benchmarks/. A class moved to
    another module and still called through its old module's alias
    (`interpreter.SftpTree`) failed only at run time, on the first SSH task."""
    import importlib

    files = [*PACKAGE.rglob("*.py"), *(REPO / "tests").rglob("*.py"),
             *(REPO / "benchmarks").glob("*.py")]  # fmt: skip
    missing = []
    for path in files:
        if "shim" in path.parts:
            continue
        tree = ast.parse(path.read_text())
        aliases = _module_aliases(tree)
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)):
                continue
            full = aliases.get(node.value.id)
            if full and not hasattr(importlib.import_module(full), node.attr):
                missing.append(
                    f"{path.relative_to(REPO)}:{node.lineno}: {node.value.id}.{node.attr}"
                )
    assert not missing, "\n".join(missing)


def test_the_rehearsal_engine_plugs_in_only_at_the_zips_start(tmp_path):
    """Issue 66, bullet 2: host/ imported gpufleet.sim in three places. Now the layer table
    forbids it, the zip's start-up installs the provider, and an agent started without it
    refuses a simulated verb in one line instead of reading real GPUs."""
    import json
    import subprocess
    import sys

    from gpufleet import layers
    from gpufleet.control.agent.bundle import MAIN

    assert all("sim" not in layers.LAYERS[p] for p in layers.LAYERS if p.startswith("host"))
    assert "provider.install()" in MAIN
    sim = {
        "state_dir": str(tmp_path / "gpus"),
        "count": 2,
        "model": "NVIDIA H200",
        "memory_mib": 1000,
        "reserved_mib": 0,
        "faults": {},
        "boot_id": None,
    }
    args = json.dumps({"sim": sim})
    out = subprocess.run([sys.executable, "-m", "gpufleet.host", "status"], input=args + "\n",
                         capture_output=True, text=True, cwd=tmp_path, timeout=60)  # fmt: skip
    final = json.loads(out.stdout.strip().splitlines()[-1])
    assert "started without the rehearsal engine" in json.dumps(final), out.stdout
    assert not (tmp_path / "gpus").exists()


def test_the_architecture_names_every_folder_of_the_package():
    """Issue 64: docs/ARCHITECTURE.md missed `sim/shim/`. Every folder under src/gpufleet
    holding a module is named in its package table (scripts/architecture.py writes it)."""
    repo = Path(__file__).resolve().parent.parent
    package = repo / "src" / "gpufleet"
    doc = (repo / "docs" / "ARCHITECTURE.md").read_text()
    folders = {
        str(d.relative_to(package))
        for d in package.rglob("*")
        if d.is_dir() and d.name != "__pycache__" and any(d.glob("*.py"))
    }
    unnamed = []
    for folder in folders:
        parent, _, name = folder.rpartition("/")
        if f"`{folder}/`" not in doc and not (parent and f"`{name}/` (" in doc):
            unnamed.append(folder)
    assert sorted(unnamed) == []
