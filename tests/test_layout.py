"""The layout holds: one-way imports, no cycles, the zipapp is host/ + sim/ and stdlib-only.

Data flows cli -> control -> host -> archive -> report (docs/ARCHITECTURE.md); a module
may import its own package or one further down that line, never one above it. Lazy
imports inside functions count too: they are imports all the same.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import zipfile
from pathlib import Path

from gpufleet.control.agent import bundle as agentzip
from gpufleet.host.agent.protocol import CONTRACT
from gpufleet.host.agent.registry import VERBS

SRC = Path(__file__).resolve().parent.parent / "src"
PACKAGE = SRC / "gpufleet"
RANK = {"cli": 0, "control": 1, "host": 2, "sim": 2, "archive": 3, "report": 4}
BASE = {
    "gpufleet",
    "gpufleet.errors",
    "gpufleet.kinds",
    "gpufleet.wire",
    "gpufleet.records",
    "gpufleet.readings",
    "gpufleet.archive.records",
}  # shared by every package
SHIPPED_BASE = {
    "gpufleet",
    "gpufleet.kinds",
    "gpufleet.wire",
    "gpufleet.records",
    "gpufleet.readings",
}  # ... and shipped in the zipapp too
SHIPPED = ("host", "sim")
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


def _package(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in RANK) else None


def test_no_module_imports_a_package_above_its_own():
    upward = []
    for source, targets in _internal_edges().items():
        if source == "gpufleet.__main__":
            continue  # the console entry point sits above everything
        src_pkg = _package(source)
        for target in targets:
            if target in BASE:
                if src_pkg in SHIPPED and target not in SHIPPED_BASE:
                    upward.append(f"{source} -> {target} (shipped code imports the control plane)")
                continue
            dst_pkg = _package(target)
            if src_pkg is None or dst_pkg is None:
                upward.append(f"{source} -> {target} (outside the layered packages)")
            elif RANK[dst_pkg] < RANK[src_pkg]:
                upward.append(f"{source} -> {target}")
            elif src_pkg in SHIPPED and dst_pkg not in SHIPPED:
                upward.append(f"{source} -> {target} (shipped code imports the control plane)")
            elif src_pkg == "sim" and dst_pkg == "host" and target != "gpufleet.host.proc.procstat":
                upward.append(f"{source} -> {target} (the rehearsal engine may use only procstat)")
    assert not upward, "imports against the one-way flow:\n" + "\n".join(sorted(upward))


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
    base = {
        "gpufleet/__init__.py",
        "gpufleet/kinds.py",
        "gpufleet/wire.py",
        "gpufleet/records.py",
        "gpufleet/readings.py",
    }
    outside = sorted(n for n in shipped if n not in base and n.split("/")[1] not in SHIPPED)
    assert not outside, f"shipped from outside host/ and sim/: {outside}"
    expected = {
        f"gpufleet/{p.relative_to(PACKAGE).as_posix()}"
        for pkg in SHIPPED
        for p in (PACKAGE / pkg).rglob("*.py")
    }
    assert expected <= shipped, f"not shipped: {sorted(expected - shipped)}"


def test_shipped_modules_import_only_the_stdlib_at_import_time():
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    offenders = []
    for name, path in _modules().items():
        if _package(name) not in SHIPPED:
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
