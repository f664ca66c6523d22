"""Launch flags that SGLang renamed, applied at preflight from the host's own `--help`.

A profile written for one release keeps working on another: where the host's SGLang no
longer accepts a flag as it is (unknown, ambiguous, or listed as deprecated) and accepts
the flag that replaced it, the argv is rewritten and the change reported ("--cuda-graph-
max-bs -> --cuda-graph-max-bs-decode on sglang 0.5.23") and recorded in the manifest. A
flag with no known rename still fails preflight, naming the candidates. Checked against
the real `--help` of the releases kept in tests/fixtures/sglang-help/.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Rename:
    old: str
    new: tuple[str, ...]  # the words that replace the old flag (a value it took follows)
    takes_value: bool
    why: str


RENAMES = {
    r.old: r
    for r in (
        Rename(
            "--cuda-graph-max-bs",
            ("--cuda-graph-max-bs-decode",),
            True,
            "split into -decode and -prefill (deprecated alias from 0.5.14, ambiguous later)",
        ),
        Rename(
            "--enable-flashinfer-allreduce-fusion",
            ("--flashinfer-allreduce-fusion-backend", "auto"),
            False,
            "deprecated in 0.5.23: use --flashinfer-allreduce-fusion-backend=auto",
        ),
    )
}


def deprecated(flag: str, help_text: str) -> bool:
    """The --help text marks this exact flag deprecated (on its line or the next)."""
    pattern = r"(?<![\w-])" + re.escape(flag) + r"(?![\w-])[^\n]*\n?[^\n]*deprecated"
    return re.search(pattern, help_text, re.I) is not None


def apply(
    argv: list[str], head: int, known: set[str], help_text: str, engine: str
) -> tuple[list[str], list[str]]:
    """argv with known renames applied where this host needs them; one note per rename."""
    out = list(argv[:head])
    notes = []
    for word in argv[head:]:
        flag, eq, value = word.partition("=")
        rename = RENAMES.get(flag) if word.startswith("--") else None
        needed = rename is not None and (flag not in known or deprecated(flag, help_text))
        if rename is None or not needed or rename.new[0] not in known:
            out.append(word)
            continue
        out += list(rename.new)
        if eq and rename.takes_value:
            out[-1] = f"{out[-1]}={value}"
        notes.append(f"{flag} -> {' '.join(rename.new)} on {engine} ({rename.why})")
    return out, notes
