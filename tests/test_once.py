"""A per-process value the fan-out's threads ask for at once is made by one thread
(control/agent/once.py): CI failed a host of a fan-out with "SystemError: AST constructor
recursion depth mismatch" once the bootstrap was made lazily behind an unlocked cache, two
threads in `ast.parse` at once (Python 3.11, CPython gh-106905)."""

from __future__ import annotations

import ast
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from gpufleet.control.agent import bundle
from gpufleet.control.agent.once import once
from gpufleet.control.connect import ssh
from helpers import REPO

THREADS = 8


def _ask_at_once(get: Callable[[], object]) -> list[object]:
    """`get()` from THREADS threads released together; what each got."""
    start, got = threading.Barrier(THREADS), []

    def ask() -> None:
        start.wait()
        got.append(get())

    threads = [threading.Thread(target=ask) for _ in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return got


def _slow_counted(real: Callable, calls: list[int]) -> Callable:
    """`real`, counted, and slow enough that every thread asks while the first one makes it."""

    def made(*args, **kwargs):
        calls.append(1)
        time.sleep(0.05)
        return real(*args, **kwargs)

    return made


# each value the fan-out's threads ask for: (its getter, the module and name of a step of
# its making to count)
MADE_ONCE = [
    pytest.param(lambda: bundle.bootstrap_source, bundle, "_inline_trust", id="bootstrap"),
    pytest.param(lambda: bundle.build, bundle, "cached_build", id="agent zip"),
    pytest.param(lambda: ssh._ssh_files, ssh, "Config", id="ssh files"),
]


@pytest.mark.parametrize(("getter", "module", "step"), MADE_ONCE)
def test_a_value_the_fan_out_asks_for_at_once_is_made_by_one_thread(
    getter, module, step, monkeypatch
):
    get, calls = getter(), []
    monkeypatch.setattr(module, step, _slow_counted(getattr(module, step), calls))
    get.cache_clear()
    try:
        got = _ask_at_once(get)
    finally:
        get.cache_clear()  # the next caller makes it again, without the counting stand-in
    assert len(calls) == 1, f"made {len(calls)} times by {THREADS} threads"
    assert len(got) == THREADS and all(g is got[0] for g in got)


def test_once_forgets_on_cache_clear():
    made = []

    @once
    def value() -> int:
        made.append(1)
        return len(made)

    assert (value(), value()) == (1, 1)
    value.cache_clear()
    assert value() == 2


def _cached_without_arguments(path: Path, root: Path = REPO) -> list[str]:
    """Functions of `path` taking no argument behind functools' cache (a per-process
    value): what `once` must make instead."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.FunctionDef) or node.args.args or node.args.kwonlyargs:
            continue
        for deco in node.decorator_list:
            target = deco.func if isinstance(deco, ast.Call) else deco
            name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
            if name in ("cache", "lru_cache"):
                found.append(f"{path.relative_to(root)}:{node.lineno} {node.name}")
    return found


def test_the_control_planes_per_process_values_are_made_by_once():
    """A census: the control plane and the CLI run the fan-out's threads, so a value made
    once per process there is `once`'s, whichever thread asks first."""
    src = REPO / "src" / "gpufleet"
    files = sorted([*(src / "control").rglob("*.py"), *(src / "cli").rglob("*.py")])
    assert len(files) > 50  # the census reads the whole control plane
    found = [f for path in files for f in _cached_without_arguments(path)]
    assert found == [], "use gpufleet.control.agent.once.once for: " + ", ".join(found)


def test_the_census_finds_a_zero_argument_cache(tmp_path):
    """The census above would see the case it exists for."""
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import functools\n@functools.lru_cache(maxsize=1)\ndef made():\n    return 1\n"
        "@functools.cache\ndef keyed(x):\n    return x\n"
    )
    assert _cached_without_arguments(sample, tmp_path) == ["sample.py:3 made"]
