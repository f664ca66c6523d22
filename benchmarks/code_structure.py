"""The code's structure, measured the way issue 36 measured it (ast and grep, nothing run):
`dict[str, Any]` annotations by package, option reads from a dict, functions over 60 lines
in cli/ and control/, modules that build a path under the archive, and calls from control/
up into cli/. Prints figures; tests/test_structure.py holds the ceilings.

    python benchmarks/code_structure.py
"""

from __future__ import annotations

import ast
import re
import sys
from collections import Counter
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "gpufleet"
# a shape not declared: dict[str, Any], dict[str, object], its alias wire.JsonObject,
# dict[Any, ...] and Mapping[str, object], counted together (issue 82.3 widened it from the
# first three); a bare `dict` annotation counts too (BARE_DICT, read from the ast)
ANY_DICT = re.compile(
    r"dict\[str,\s*(?:Any|object)\]|dict\[Any,|Mapping\[str,\s*(?:Any|object)\]"
    r"|\bJsonObject\b(?!\s*[:=]\s*typing)"
)
IMPORT = re.compile(r"\s*(from|import)\s|\s+\w+,$|\s+JsonObject,?$")  # import lines
OPTION_READ = re.compile(r"\bo\[\"\w+\"\]")


def modules() -> list[Path]:
    return sorted(p for p in SRC.rglob("*.py") if "__pycache__" not in p.parts)


def package_of(path: Path) -> str:
    rel = path.relative_to(SRC)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def any_dicts() -> Counter[str]:
    counts: Counter[str] = Counter()
    for path in modules():
        lines = [line for line in path.read_text().splitlines() if not IMPORT.match(line)]
        counts[package_of(path)] += sum(len(ANY_DICT.findall(line)) for line in lines)
        counts[package_of(path)] += len(bare_dicts(path))
    return counts


def _annotations(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            a = node.args
            every = [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg]
            yield from (x.annotation for x in every if x is not None and x.annotation)
            if node.returns is not None:
                yield node.returns
        elif isinstance(node, ast.AnnAssign):
            yield node.annotation


def bare_dicts(path: Path) -> list[int]:
    """The lines of `path` whose annotation names `dict` with no key or value type."""
    found = []
    for annotation in _annotations(ast.parse(path.read_text())):
        subscripted = {id(n.value) for n in ast.walk(annotation) if isinstance(n, ast.Subscript)}
        found += [
            n.lineno
            for n in ast.walk(annotation)
            if isinstance(n, ast.Name) and n.id == "dict" and id(n) not in subscripted
        ]
    return found


def option_reads() -> int:
    return sum(len(OPTION_READ.findall(p.read_text())) for p in (SRC / "cli").rglob("*.py"))


def long_functions(limit: int = 60):
    """Functions over `limit` lines anywhere in the package."""
    out = []
    for path in modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > limit:
                    out.append((f"{path.relative_to(SRC)}:{node.name}", length))
    return sorted(out, key=lambda item: -item[1])


def long_signatures(limit: int = 8) -> list[tuple[str, int]]:
    """Functions taking more than `limit` parameters (self/cls not counted; *args and
    **kwargs count one each): a call that carries more passes a frozen spec dataclass."""
    out = []
    for path in modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                a = node.args
                named = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
                count = len([n for n in named if n not in ("self", "cls")])
                count += (a.vararg is not None) + (a.kwarg is not None)
                if count > limit:
                    out.append((f"{path.relative_to(SRC)}:{node.lineno} {node.name}", count))
    return sorted(out, key=lambda item: -item[1])


def positional_tails(wide: int = 6, first: int = 4) -> list[tuple[str, int]]:
    """Functions of `wide` or more parameters that take more than the `first` few
    positionally (self/cls not counted): past those a call names what it passes, so a
    reordered or added parameter cannot shift a value into the wrong one (issue 82.8). A
    function with *args takes the rest keyword-only already."""
    out = []
    for path in modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                a = node.args
                positional = [x.arg for x in a.posonlyargs + a.args if x.arg not in ("self", "cls")]
                count = len(positional) + len(a.kwonlyargs) + (a.kwarg is not None)
                if a.vararg is None and count >= wide and len(positional) > first:
                    out.append(
                        (f"{path.relative_to(SRC)}:{node.lineno} {node.name}", len(positional))
                    )
    return sorted(out)


def widest_function() -> tuple[str, int]:
    """The function with the most parameters (self/cls not counted), and how many."""
    found = long_signatures(limit=0)
    return found[0] if found else ("", 0)


ARCHIVE_PATHS = re.compile(
    r"Layout\(|Archive\((?!\))|\.root\s*/|Path\([\"']logs|/\s*[\"'](sweeps|tunes|findmax|"
    r"compare|health)[\"']"
)


def long_modules(limit: int = 450) -> list[tuple[str, int]]:
    """Modules over `limit` lines anywhere in the package."""
    sizes = [(str(p.relative_to(SRC)), p.read_text().count("\n")) for p in modules()]
    return sorted(((name, n) for name, n in sizes if n > limit), key=lambda item: -item[1])


def undocumented_in_control() -> list[str]:
    """Public functions, classes and methods of control/ without a docstring."""
    out = []
    for path in modules():
        if package_of(path) != "control":
            continue
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                continue
            members = [node]
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                members += [
                    m for m in node.body if isinstance(m, ast.FunctionDef | ast.AsyncFunctionDef)
                ]
            for member in members:
                if member.name.startswith("_") or ast.get_docstring(member):
                    continue
                where = f"{node.name}.{member.name}" if member is not node else node.name
                out.append(f"{path.relative_to(SRC)}:{where}")
    return out


def archive_path_builders() -> list[str]:
    """Modules outside archive/ that build a path under the archive root themselves (a
    Layout, an Archive made from a root, `root / "sweeps"`, `Path("logs")`); a help text
    naming logs/ and the host's own `logs/` in its workdir are not the archive."""
    out = []
    for path in modules():
        if package_of(path) in ("archive", "host", "sim"):  # the host has no archive
            continue
        if ARCHIVE_PATHS.search(path.read_text()):
            out.append(str(path.relative_to(SRC)))
    return out


def control_calls_into_cli() -> list[str]:
    out = []
    for path in modules():
        if package_of(path) != "control":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("gpufleet.cli"):
                out.append(f"{path.relative_to(SRC)} imports {node.module}")
    return out


def main() -> int:
    dicts = any_dicts()
    print(f"undeclared shapes (dict[str, Any|object], JsonObject, dict[Any, ...], "
          f"Mapping[str, object], bare dict): {sum(dicts.values())} "
          f"({', '.join(f'{k} {v}' for k, v in dicts.most_common() if v)})")  # fmt: skip
    print(f'option reads o["..."] in cli/: {option_reads()}')
    long = long_functions()
    print(f"functions over 60 lines: {len(long)}")
    for name, length in long:
        print(f"  {name}: {length}")
    wide = long_signatures()
    print(f"functions over 8 parameters: {len(wide)}")
    for name, count in wide:
        print(f"  {name}: {count}")
    big = long_modules()
    print(f"modules over 450 lines: {len(big)}")
    for name, length in big:
        print(f"  {name}: {length}")
    largest = long_modules(limit=0)[0]
    print(f"largest module: {largest[0]} {largest[1]} lines")
    print("widest function: {} ({} parameters)".format(*widest_function()))
    tails = positional_tails()
    print(f"functions of 6+ parameters taking more than 4 positionally: {len(tails)}")
    for name, count in tails:
        print(f"  {name}: {count}")
    print(f"public names of control/ without a docstring: {len(undocumented_in_control())}")
    builders = archive_path_builders()
    print(f"modules outside archive/ building archive paths: {len(builders)}")
    for name in builders:
        print(f"  {name}")
    up = control_calls_into_cli()
    print(f"control/ imports of cli/: {len(up)}")
    for text in up:
        print(f"  {text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
