"""The layout, declared once: which package may import which. tests/test_layout.py
enforces it on every import (lazy ones too) and docs/ARCHITECTURE.md's package table is
generated from it (`python scripts/architecture.py`); a test fails when they differ.

Data flows cli -> control -> host -> archive -> report; imports point from the user
towards the facts: a task (cli) calls the control plane, which drives hosts through the
agent and reads the archive through the report. Nothing imports in a circle, between
modules or between packages, and nothing on the host imports the control plane: the
zipapp is `host/` and `sim/` whole, plus the shipped base.
"""

from __future__ import annotations

# Modules every package may import: records and words that cross every boundary. The
# shipped ones travel in the agent's zip, so host/ and sim/ may import only those.
SHIPPED_BASE = (
    "__init__", "kinds", "wire", "records", "readings", "engine_facts", "per_request",
)  # fmt: skip
BASE = (*SHIPPED_BASE, "errors", "layers", "terminal")  # layers: the zip ships its SHIPPED_BASE

# package -> the packages it may import besides its own and the base, lowest layers first
LAYERS: dict[str, tuple[str, ...]] = {
    "host/agent": (),
    "sim": ("host/agent",),
    "host/proc": ("host/agent",),
    "host/gpu": ("host/agent", "host/proc"),
    "host/server": ("host/agent", "host/proc", "host/gpu"),
    "host/bench": ("host/agent", "host/proc", "host/gpu", "host/server"),
    "host": ("host/agent", "host/proc", "host/gpu", "host/server", "host/bench"),
    "archive": (),
    "report": ("archive",),
    # across hosts and over time: the archive's index, outliers, history, OpenMetrics
    "fleet": ("archive", "report"),
    "control/agent": ("host/agent",),
    "control/inventory": ("host/agent", "archive"),
    "control/connect": ("control/agent", "control/inventory", "host/agent"),
    "control/server": (
        "control/connect", "control/inventory", "host/agent", "host/proc", "archive", "report",
    ),
    "control/bench": (
        "control/connect", "control/inventory", "control/server", "host/agent", "host/bench",
        "archive", "report",
    ),
    "control/sweep": (
        "control/connect", "control/inventory", "control/server", "control/bench",
        "host/agent", "archive", "report",
    ),
    "control/tune": (
        "control/server", "control/bench", "control/sweep", "archive", "report",
    ),
    "control": (),
    "cli": (
        "control/connect", "control/inventory", "control/server", "control/bench",
        "control/sweep", "control/tune", "host/agent", "host/bench", "archive", "report",
        "fleet",
    ),
}  # fmt: skip

# packages shipped to hosts in the agent's zip: they import nothing of the control plane
SHIPPED = tuple(p for p in LAYERS if p == "host" or p.startswith(("host/", "sim")))

# where each package runs, for the architecture table
RUNS_ON = {
    "cli": "control machine",
    "control": "control machine",
    "archive": "control machine",
    "report": "control machine",
    "fleet": "control machine",
    "host": "GPU host (zipapp)",
    "sim": "GPU host (rehearsal)",
}


def runs_on(package: str) -> str:
    return RUNS_ON[package.split("/")[0]]
