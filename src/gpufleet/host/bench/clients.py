"""The bench clients a run can measure with (`--engine`), one registry: each entry names
the client, the function that measures a level with it and what it can send, so the
task's choices and help, the control machine's refusals (control/bench/request.py) and
the runner (host/bench/runner.py, which calls the entry's level function) all read the
entry, never the client's name: a bench client is its module and its line here. Light:
`inv --list` reads it for the help, so the level function is named, imported when a run
calls it (as control/inventory/connections.py names a connection's Session).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpufleet.host.bench.clientapi import LevelFunction


@dataclass(frozen=True)
class BenchClient:
    name: str  # what --engine says
    help: str
    level: str  # "module:function", a clientapi.LevelFunction: measures one level
    token_ids: bool = True  # sends token-id prompts (random-ids, shared-prefix, traces)
    duration: bool = True  # runs a level for --duration
    processes: bool = True  # spreads a level over --client-procs generator processes
    sessions: bool = True  # a multi-turn session is several requests
    # its own limit on one request where it keeps one past the plan's (host/bench/jobend.py)
    request_limit_s: float = 0.0

    def level_function(self) -> LevelFunction:
        """The function the runner calls for each level, imported now (on the host)."""
        module, _, function = self.level.partition(":")
        return getattr(importlib.import_module(module), function)


CLIENTS: dict[str, BenchClient] = {
    c.name: c
    for c in (
        BenchClient(
            "gpufleet", "gpufleet's own load generator", "gpufleet.host.bench.ownclient:bench_level"
        ),
        BenchClient(
            "sglang-bench",
            "SGLang's own bench_serving on the host",
            "gpufleet.host.bench.sglang_bench:bench_level",
            token_ids=False,
            duration=False,
            processes=False,
            sessions=False,
            # bench_serving's aiohttp total: 6 h in sglang/bench_serving.py, 20 h in its
            # later sglang/benchmark package; the larger
            request_limit_s=20 * 3600.0,
        ),
    )
}
NAMES = tuple(CLIENTS)
HELP = " or ".join(f"{c.name} ({c.help})" for c in CLIENTS.values())


def able(fact: str) -> str:
    """The clients that can do `fact` (a field of BenchClient), for a refusal's advice."""
    return " or ".join(f"--engine {c.name}" for c in CLIENTS.values() if getattr(c, fact))
