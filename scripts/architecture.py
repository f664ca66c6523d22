"""docs/ARCHITECTURE.md's package table, generated from the layers table (gpufleet/layers.py)
and every package's own docstring, so the document cannot drift from the code.

    python scripts/architecture.py           # rewrite the table in docs/ARCHITECTURE.md
    python scripts/architecture.py --check   # exit 1 when the document differs (a test runs it)
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "src" / "gpufleet"
DOC = REPO / "docs" / "ARCHITECTURE.md"
BEGIN, END = "<!-- layers:begin (scripts/architecture.py) -->", "<!-- layers:end -->"
sys.path.insert(0, str(REPO / "src"))

from gpufleet import layers  # noqa: E402 - the table, read from this checkout


def _docstring(path: Path) -> str:
    return " ".join((ast.get_docstring(ast.parse(path.read_text())) or "").split())


def _modules(package: str) -> str:
    """The package's modules, and any folder inside it that the layers table does not list
    on its own (`sim/shim/`), with its modules, so every folder of the package is named."""
    folder = PACKAGE / package
    names = [f"`{p.stem}`" for p in sorted(folder.glob("*.py")) if p.stem != "__init__"]
    for inner in sorted(d for d in folder.iterdir() if d.is_dir() and d.name != "__pycache__"):
        if f"{package}/{inner.name}" not in layers.LAYERS and any(inner.glob("*.py")):
            inside = ", ".join(f"`{m.stem}`" for m in sorted(inner.glob("*.py")))
            names.append(f"`{inner.name}/` ({inside})")
    return ", ".join(names) or "-"


def table() -> str:
    rows = ["| package | runs on | what it owns | modules | may import (besides the base) |",
            "|---|---|---|---|---|"]  # fmt: skip
    for package in reversed(layers.LAYERS):  # the user's end first
        allowed = ", ".join(f"`{p}/`" for p in layers.LAYERS[package]) or "the base only"
        doc = _docstring(PACKAGE / package / "__init__.py")
        rows.append(f"| `{package}/` | {layers.runs_on(package)} | {doc} | "
                    f"{_modules(package)} | {allowed} |")  # fmt: skip
    base = ", ".join(f"`{name}.py`" for name in layers.BASE)
    shipped = ", ".join(f"`{name}.py`" for name in layers.SHIPPED_BASE)
    return "\n".join([
        *rows, "",
        f"The base, which every package may import: {base}. Shipped in the agent's zip, and "
        f"so the only base that `host/` and `sim/` may import: {shipped}.",
    ])  # fmt: skip


def rendered(text: str) -> str:
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{table()}\n{END}{tail}"


def main() -> int:
    text = DOC.read_text()
    new = rendered(text)
    if "--check" in sys.argv[1:]:
        if new != text:
            print("docs/ARCHITECTURE.md's package table differs from gpufleet/layers.py: "
                  "run python scripts/architecture.py")  # fmt: skip
            return 1
        return 0
    DOC.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
