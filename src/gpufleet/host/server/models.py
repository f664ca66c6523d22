"""The model a root server loads is judged like the code it runs (issue 50, bullet 5).

A server reads its model directory as root: with remote code trusted it imports the
directory's `*.py` (SGLang's and vLLM's `--trust-remote-code`), and any entry another user
can replace is theirs to swap between the launch and the load. So each model path the
engine's adapter names (control/server/engines.py: model_files) passes the trust rule: the
path and every directory on its way, and, where the model's own Python runs, every file and
directory under it. A host with `python_trust: warn` (a lab machine's shared models) runs
it, and the launch says why it should not. Standard library only: this module ships.
"""

from __future__ import annotations

import os

from gpufleet.host.agent import trust
from gpufleet.records import LaunchSpec

WHAT = "model path"


def problems(spec: LaunchSpec) -> list[str]:
    """One line per model path the rule does not trust (path, owner, mode and fix)."""
    uid = os.geteuid()
    out = []
    for path in spec.model_paths:
        reason = trust.trusted(path, uid, trust.ANY, what=WHAT)
        if reason is None and spec.model_code and os.path.isdir(path):
            try:
                trust.judge_tree(path, uid, (), f"{WHAT} (its remote code runs as root)")
            except trust.Untrusted as exc:
                reason = str(exc)
        if reason:
            out.append(reason)
    return out


def refusals_and_warnings(spec: LaunchSpec) -> tuple[list[str], list[str]]:
    """The lines that refuse the launch, or (python_trust: warn) the ones said before it."""
    found = problems(spec)
    if spec.model_trust == "warn":
        return [], [f"loading an untrusted model (python_trust: warn): {line}" for line in found]
    return found, []
