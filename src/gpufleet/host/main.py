"""Dispatch `agent.pyz VERB` (arguments on stdin) and print its answer as the last JSON line."""

from __future__ import annotations

import sys
import traceback

from gpufleet.host import nvml, serverkeys
from gpufleet.host.protocol import AgentError, emit_error, emit_result, read_args
from gpufleet.kinds import Kind


def main(argv: list[str]) -> int:
    from gpufleet.host.verbs import VERBS

    if len(argv) != 1 or argv[0] not in VERBS:
        emit_error(f"usage: agent.pyz {{{','.join(sorted(VERBS))}}} < ARGS.json", "bad_input")
        return 2
    verb = argv[0]
    try:
        serverkeys.remember_all()  # no answer carries a server's key
        args = read_args(verb, sys.stdin)
        if args.sim:
            nvml.activate_simulation(args.sim, args.host or "sim")
        emit_result(VERBS[verb](args))
        return 0
    except AgentError as exc:
        emit_error(str(exc), kind=exc.kind)
        return 0
    except Exception as exc:  # a bug: report it with its traceback for the control plane
        emit_error(f"agent {verb} crashed: {exc!r}\n{traceback.format_exc()}", kind=Kind.CRASH)
        return 1
