"""Launch flags an engine renamed, applied at preflight from the host's own `--help`.

A profile written for one release keeps working on another: where the host's engine no
longer accepts a flag as it is (unknown, ambiguous, or listed as deprecated) and accepts
the flag that replaced it, the argv is rewritten and the change reported ("--cuda-graph-
max-bs -> --cuda-graph-max-bs-decode on sglang 0.5.23") and recorded in the manifest. A
flag with no known rename still fails preflight, naming the candidates. Which flags were
renamed is the engine's adapter's knowledge (control/server/engines.py), carried in the launch
spec; this module only applies them.
"""

from __future__ import annotations

import re

from gpufleet.records import RenameSpec


def deprecated(flag: str, help_text: str) -> bool:
    """The --help text marks this exact flag deprecated (on its line or the next)."""
    pattern = r"(?<![\w-])" + re.escape(flag) + r"(?![\w-])[^\n]*\n?[^\n]*deprecated"
    return re.search(pattern, help_text, re.I) is not None


def apply(
    argv: list[str], head: int, known: set[str], help_text: str, *, engine: str,
    renames: list[RenameSpec],
) -> tuple[list[str], list[str]]:  # fmt: skip
    """argv with the engine's renames (engines.Rename as JSON) applied where this host
    needs them; one note per rename."""
    table = {str(r["old"]): r for r in renames}
    out = list(argv[:head])
    notes = []
    for word in argv[head:]:
        flag, eq, value = word.partition("=")
        rename = table.get(flag) if word.startswith("--") else None
        needed = rename is not None and (flag not in known or deprecated(flag, help_text))
        if rename is None or not needed or rename["new"][0] not in known:
            out.append(word)
            continue
        new = [str(w) for w in rename["new"]]
        out += new
        if eq and rename["takes_value"]:
            out[-1] = f"{out[-1]}={value}"
        notes.append(f"{flag} -> {' '.join(new)} on {engine} ({rename['why']})")
    return out, notes
