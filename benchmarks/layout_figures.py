"""The house's figures, measured the same way before and after a move (issue 49): modules
per package, the longest function and module in each, README length, and the rooms one
`inv tune` passes through in the control process, from the task to the archive.

The trace reads the tune as a newcomer would follow it: every gpufleet function in the
control process, in the order it is first called (the agent's own processes are not traced),
consecutive functions of one room collapsed. A room is a module, and again a package
(`control/tune`); "entered" counts distinct rooms, "returns" entries into a room already
left, "climbs" steps from a package back up the data flow (cli -> control -> host ->
archive -> report).

    python benchmarks/layout_figures.py            # static figures only (instant)
    python benchmarks/layout_figures.py --trace    # and one rehearsal tune, traced (~1 min)
"""

from __future__ import annotations

import ast
import contextlib
import io
import itertools
import sys
import tempfile
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src" / "gpufleet"


def package_of(path: Path) -> str:
    """The package a module lives in: `control/tune/tune_run.py` is `control/tune`."""
    rel = path.relative_to(SRC)
    return "/".join(rel.parts[:-1]) or "(top)"


def static_figures() -> list[str]:
    modules: Counter[str] = Counter()
    longest_function: dict[str, tuple[int, str]] = {}
    longest_module: dict[str, tuple[int, str]] = {}
    for path in sorted(SRC.rglob("*.py")):
        package = package_of(path)
        modules[package] += 1
        text = path.read_text()
        lines = text.count("\n")
        longest_module[package] = max(longest_module.get(package, (0, "")), (lines, path.name))
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                best = longest_function.get(package, (0, ""))
                longest_function[package] = max(best, (length, f"{path.name}:{node.name}"))
    out = [f"{'package':<22} {'modules':>7}  longest function            longest module"]
    for package in sorted(modules):
        fn_len, fn = longest_function.get(package, (0, "-"))
        mod_len, mod = longest_module[package]
        out.append(f"{package:<22} {modules[package]:>7}  {fn:<24} {fn_len:>3}  {mod} {mod_len}")
    readme = (REPO / "README.md").read_text()
    out.append(f"README.md: {readme.count(chr(10))} lines, {len(readme.encode())} bytes")
    return out


def traced_tune() -> str:
    """One rehearsal tune in this process, every gpufleet call traced by module."""
    from gpufleet.cli.console import program

    seen: set[object] = set()
    order: list[str] = []

    def profile(frame, event, arg):
        if event != "call" or frame.f_code in seen:
            return
        seen.add(frame.f_code)
        module = frame.f_globals.get("__name__", "")
        if module.startswith("gpufleet."):
            order.append(module)

    with tempfile.TemporaryDirectory() as tmp:
        argv = ["gpufleet", "tune", "--profile", "rehearsal-eagle3", "--depths", "1",
                "--concurrency", "1", "--num-prompts", "4", "--output-len", "8",
                "--no-verify", "--archive", str(Path(tmp) / "a")]  # fmt: skip
        sys.setprofile(profile)
        try:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
                program.run(argv)
        finally:
            sys.setprofile(None)
    modules = _collapse(order)
    packages = _collapse([m.rsplit(".", 1)[0] if m.count(".") > 1 else m for m in order])
    return (
        f"inv tune: {len(set(modules))} modules entered, {len(modules) - len(set(modules))} "
        f"returns; {len(set(packages))} packages entered, "
        f"{len(packages) - len(set(packages))} returns, {_climbs(packages)} climbs"
    )


RANK = {"cli": 0, "control": 1, "host": 2, "sim": 2, "archive": 3, "report": 4}


def _collapse(rooms: list[str]) -> list[str]:
    return [r for i, r in enumerate(rooms) if i == 0 or rooms[i - 1] != r]


def _climbs(packages: list[str]) -> int:
    ranks = [RANK.get(p.split(".")[1], -1) if "." in p else -1 for p in packages]
    ranked = [r for r in ranks if r >= 0]
    return sum(1 for a, b in itertools.pairwise(ranked) if b < a)


def main() -> int:
    print("\n".join(static_figures()))
    if "--trace" in sys.argv:
        print(traced_tune())
    return 0


if __name__ == "__main__":
    sys.exit(main())
