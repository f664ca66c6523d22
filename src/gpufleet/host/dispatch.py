"""Dispatch `agent.pyz VERB` (arguments on stdin) and print its answer as the last JSON line.

`agent.pyz serve` answers several verbs per start: one `VERB ARGS-JSON` line per call on
stdin, each answered as a one-shot agent would (events, then one final line), until stdin
ends. The control plane keeps one such agent per host for a task, over the task's one SSH
connection, instead of a new Python and a new remote command per verb.
"""

from __future__ import annotations

import io
import os
import sys
import traceback
from typing import TextIO

from gpufleet.host.agent import ownership
from gpufleet.host.agent.heartbeat import Heartbeat
from gpufleet.host.agent.protocol import (
    KEEPER,
    MARK,
    SERVE,
    AgentError,
    Hello,
    emit_error,
    emit_event,
    emit_result,
    read_args,
    write_line,
)
from gpufleet.host.gpu import nvml
from gpufleet.host.proc import stepkeeper
from gpufleet.host.server import keys as serverkeys
from gpufleet.kinds import Kind


def run_verb(verb: str, stream: TextIO) -> int:
    """One verb: its arguments from the first line of `stream`, its answer on stdout."""
    from gpufleet.host.registry import VERBS

    try:
        serverkeys.remember_all()  # no answer carries a server's key
        args = read_args(verb, stream)
        if args.sim:
            nvml.activate_simulation(args.sim, args.host or "sim")
        if args.changes_host():  # one task at a time changes this host; a gpu-clean ends
            # a stopped owner, or a runner past its job's end
            took = ownership.claim(args.owner, take_over=verb == "clean", host=args.host)
            if took:
                emit_event({"warning": took})
        emit_result(VERBS[verb](args))
        return 0
    except AgentError as exc:
        emit_error(str(exc), kind=exc.kind)
        return 0
    except Exception as exc:  # a bug: report it with its traceback for the control plane
        emit_error(f"agent {verb} crashed: {exc!r}\n{traceback.format_exc()}", kind=Kind.CRASH)
        return 1


MAX_LINE = 64 << 20  # characters of one verb's line: a launch's files, a bench's prompts


def _lines(stdin: TextIO, limit: int):
    """stdin's lines, each read with at most `limit` characters in memory; a longer line
    is skipped whole and stands as None (its start, for the error, as the second item)."""
    while True:
        line = stdin.readline(limit + 1)
        if not line:
            return
        if len(line) <= limit or line.endswith("\n"):
            yield line, ""
            continue
        start = line[:40]
        while line and not line.endswith("\n"):  # drop the rest, a bounded read at a time
            line = stdin.readline(limit)
        yield None, start


def serve(stdin: TextIO, limit: int = MAX_LINE) -> int:
    """Answer `VERB ARGS` lines until stdin ends; a hello line first says where we run."""
    from gpufleet.host.registry import VERBS

    hello: Hello = {"workdir": os.getcwd(), "pid": os.getpid()}
    write_line({MARK: 1, "hello": hello})
    for line, start in _lines(stdin, limit):
        if line is None:
            said = f"serve: a line over {limit} characters (starting {start!r})"
            emit_error(said, Kind.BAD_INPUT)
            continue
        verb, _, rest = line.strip().partition(" ")
        if not verb:
            continue
        if verb not in VERBS:
            emit_error(f"serve: unknown verb {verb!r}", Kind.BAD_INPUT)
            continue
        with Heartbeat(MARK):  # the control plane's silence limit tells quiet from hung
            run_verb(verb, io.StringIO(rest + "\n"))
    return 0


def main(argv: list[str]) -> int:
    from gpufleet.host.registry import VERBS

    if argv == [SERVE]:
        return serve(sys.stdin)
    if len(argv) == 2 and argv[0] == KEEPER:
        return stepkeeper.serve(argv[1])
    if len(argv) != 1 or argv[0] not in VERBS:
        emit_error(
            f"usage: agent.pyz {{{','.join(sorted([*VERBS, SERVE]))}}} < ARGS.json, or "
            f"agent.pyz {KEEPER} JOB",
            "bad_input",
        )
        return 2
    return run_verb(argv[0], sys.stdin)
