"""The bench clients a run can measure with (`--engine`), one registry: each entry names
the client and says what it can send, so the task's choices and help, the control
machine's refusals (control/bench/request.py) and the runner's choice of level
(host/bench/runner.py) all read the entry, never the client's name. Light: `inv --list`
reads it for the help.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BenchClient:
    name: str  # what --engine says
    help: str
    external: bool = False  # a program of its own per level (SGLang's bench_serving)
    token_ids: bool = True  # sends token-id prompts (random-ids, shared-prefix, traces)
    duration: bool = True  # runs a level for --duration
    processes: bool = True  # spreads a level over --client-procs generator processes
    sessions: bool = True  # a multi-turn session is several requests
    # its own limit on one request where it keeps one past the plan's (host/bench/jobend.py)
    request_limit_s: float = 0.0


CLIENTS: dict[str, BenchClient] = {
    c.name: c
    for c in (
        BenchClient("gpufleet", "gpufleet's own load generator"),
        BenchClient(
            "sglang-bench",
            "SGLang's own bench_serving on the host",
            external=True,
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
