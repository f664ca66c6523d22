"""Dispatch `VERB ARGS` to a verb and print its answer as the last JSON line."""

from __future__ import annotations

import traceback

from gpufleet.agent import nvmlread
from gpufleet.agent.protocol import AgentError, decode_args, emit_error, emit_result


def main(argv: list[str]) -> int:
    from gpufleet.agent.verbs import VERBS

    if len(argv) != 2 or argv[0] not in VERBS:
        emit_error(f"usage: agent.pyz {{{','.join(sorted(VERBS))}}} ARGS", kind="bad_input")
        return 2
    verb, word = argv
    try:
        args = decode_args(word)
        if args.get("sim"):
            nvmlread.activate_simulation(args["sim"], args.get("host", "sim"))
        emit_result(VERBS[verb](args))
        return 0
    except AgentError as exc:
        emit_error(str(exc), kind=exc.kind)
        return 0
    except Exception as exc:  # a bug: report it with its traceback for the control plane
        emit_error(f"agent {verb} crashed: {exc!r}\n{traceback.format_exc()}", kind="crash")
        return 1
