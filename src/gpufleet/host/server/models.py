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


# what an engine's `--config FILE` (SGLang's flat YAML, one `key: value` a line) may say of
# the model: where it is and whether its own Python runs (issue 68.3: trust-remote-code
# set in the config file was not judged)
CONFIG_FLAG = "--config"
CONFIG_MODEL_KEYS = ("model-path", "model", "speculative-draft-model-path", "tokenizer-path",
                     "tokenizer")  # fmt: skip
CONFIG_LIMIT = 1 << 20


def config_claims(argv: list[str]) -> tuple[list[str], bool, list[str]]:
    """The model paths and the remote-code switch the engine's config file sets, and why
    the file itself cannot be trusted (root reads it; another user could rewrite it)."""
    if CONFIG_FLAG not in argv[:-1]:
        return [], False, []
    path = argv[argv.index(CONFIG_FLAG) + 1]
    reason = trust.trusted(path, os.geteuid(), trust.ANY, what="engine config file")
    if reason:
        return [], False, [reason]
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            text = fh.read(CONFIG_LIMIT)
    except OSError:
        return [], False, []  # the engine says it (the flag check runs its --help first)
    paths, code = [], False
    for line in text.splitlines():
        if not line or line[0] in " \t#-":
            continue
        key, sep, value = line.partition(":")
        key, value = key.strip().replace("_", "-"), value.split("#")[0].strip().strip("'\"")
        if not sep:
            continue
        if key == "trust-remote-code" and value.lower() in ("true", "yes", "on", "1"):
            code = True
        elif key in CONFIG_MODEL_KEYS and value.startswith("/"):
            paths.append(value)
    return paths, code, []


def problems(spec: LaunchSpec, as_root: bool = True) -> list[str]:
    """One line per model path the rule does not trust (path, owner, mode and fix)."""
    uid = os.geteuid()
    more, code_in_config, out = config_claims(spec.argv)
    model_code = spec.model_code or code_in_config
    if model_code and as_root and not spec.model_paths_known:
        out.append(
            f"the {spec.engine} server runs its model's own Python (--trust-remote-code) as "
            "root, and gpufleet cannot find every model path its command loads to judge "
            "them: set run_as: USER for this host, or python_trust: warn to run it knowingly"
        )
    for path in [*spec.model_paths, *more]:
        reason = trust.trusted(path, uid, trust.ANY, what=WHAT)
        if reason is None and model_code and os.path.isdir(path):
            try:
                trust.judge_tree(path, uid, (), f"{WHAT} (its remote code runs as root)")
            except trust.Untrusted as exc:
                reason = str(exc)
        if reason:
            out.append(reason)
    return out


def refusals_and_warnings(spec: LaunchSpec, as_root: bool = True) -> tuple[list[str], list[str]]:
    """The lines that refuse the launch, or (python_trust: warn) the ones said before it."""
    found = problems(spec, as_root)
    if spec.model_trust == "warn":
        return [], [f"loading an untrusted model (python_trust: warn): {line}" for line in found]
    return found, []
