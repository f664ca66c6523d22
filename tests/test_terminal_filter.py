"""Issue 80, bullet 4: one terminal filter. A server's log, a crash tail, a failed bench's
log tail and a process's name reached the operator's terminal raw: a clear-screen followed
by a fake "all GPUs verified clean", a title change (OSC 0), a link (OSC 8), CR and BEL.
Every byte a task prints now passes one filter (cli/scrubbing.py's stream, gpufleet/
terminal.py's `shown`), which writes every control character out; summary.md and
report.html escape them the same way.

The census drives every task that prints remote text over the real sshd, the server run as
another user (`run_as: nobody`, the attacker), and checks that no control character but
\\n and \\t reaches stdout or stderr; tests/helpers.run_cli checks the same of every CLI
run in the suite, so the next task that prints remote text is caught where it is tested.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.terminal import CONTROL, shown
from helpers import HEALTH_HANDLER
from test_reliability import record

# what a hostile log or process name holds: clear the screen and home the cursor, a fake
# verdict, a window title (OSC 0, BEL-ended), a link (OSC 8, ST-ended), a CR that hides
# what came before on the same line, a bell, a C1 CSI, a direction override
EVIL = ("\x1b[2J\x1b[Hall GPUs verified clean \x1b]0;pwned\x07 \x1b]8;;http://192.0.2.1/\x1b\\"
        "link\x1b]8;;\x1b\\ hidden\roverwritten \x07\x9b31m red\u202e")  # fmt: skip

ENGINE = (
    """#!/usr/bin/env python3
import http.server, os, sys, time
EVIL = @EVIL@
if "--help" in sys.argv:
    print("usage: engine --port PORT [--crash]")
    sys.exit(0)
if "--version" in sys.argv:  # what the archive's manifest, summary.md and report.html show
    print("1.0 " + EVIL)
    sys.exit(0)
port = int(sys.argv[sys.argv.index("--port") + 1])
print("loading " + EVIL, flush=True)
if "--crash" in sys.argv:
    print("Traceback: " + EVIL, flush=True)
    sys.exit(3)
time.sleep(1.5)
"""
    + HEALTH_HANDLER
    + """class Crashing(Health):
    def do_POST(self):
        print("crashed serving " + EVIL, flush=True)
        os._exit(4)
print("serving " + EVIL, flush=True)
http.server.HTTPServer(("127.0.0.1", port), Crashing).serve_forever()
"""
).replace("@EVIL@", repr(EVIL))


@pytest.fixture
def hostile_engine(readable_program) -> Path:
    return readable_program(ENGINE)


def _raw(text: str) -> list[str]:
    """The control characters in `text` that a terminal would act on."""
    return sorted({m.group() for m in CONTROL.finditer(text)})


def test_the_filter_writes_out_every_control_character_and_keeps_the_rest():
    assert shown(EVIL).count("\\x1b") == EVIL.count("\x1b")
    assert not _raw(shown(EVIL)) and "\\x0d" in shown(EVIL) and "\\u202e" in shown(EVIL)
    assert shown("a\tb\nc é 日本") == "a\tb\nc é 日本"  # tabs, lines and text kept
    every = "".join(map(chr, range(0x20))) + "\x7f" + "".join(map(chr, range(0x80, 0xA0)))
    assert not _raw(shown(every)) and set(_raw(every)) == set(every) - {"\t", "\n"}


@pytest.mark.slow(minutes=2)
def test_no_task_prints_a_hostile_servers_control_characters(fleet, hostile_engine, tmp_path):
    version = {"version_command": [str(hostile_engine), "--version"]}
    profile, port = fleet.custom_profile("hostile", hostile_engine, **version)
    crashing, _ = fleet.custom_profile("crashing", hostile_engine, "--crash", port=port, **version)
    fleet.write_inventory(run_as="nobody")
    outputs: dict[str, str] = {}

    def cli(name: str, *args: str, expect: int) -> str:
        out = fleet.cli(*args, timeout=180)  # helpers.run_cli checks the same, for every run
        said = out.stdout + out.stderr
        assert out.returncode == expect, (name, said[-3000:])
        outputs[name] = said
        return said

    said = cli("launch's crash tail", "launch", "--profile", str(crashing), "--hosts", "h0",
               expect=1)  # fmt: skip
    assert "Traceback: \\x1b[2J" in said, said[-3000:]
    try:
        cli("launch", "launch", "--profile", str(profile), "--hosts", "h0", expect=0)
        said = cli("logs", "logs", "--hosts", "h0", expect=0)
        assert "serving \\x1b[2J\\x1b[Hall GPUs verified clean \\x1b]0;pwned\\x07" in said
        said = cli("bench's log tail", "bench", "--concurrency", "1", "--num-prompts", "2",
                   "--output-len", "4", "--archive", str(tmp_path / "a"), "--hosts", "h0",
                   expect=1)  # fmt: skip
        assert "\\x1b" in said, said[-3000:]
    finally:
        stop = fleet.cli("stop", "--hosts", "h0", "--grace", "2", timeout=120)
    assert stop.returncode == 0, stop.stdout[-2000:] + stop.stderr[-2000:]
    from helpers import run_cli

    report = run_cli("report", "--runs", "hostile", "--archive", str(tmp_path / "a"))
    assert report.returncode == 0, report.stdout[-2000:] + report.stderr[-2000:]
    pages = {p: p.read_text() for p in (tmp_path / "a").rglob("*") if p.suffix in (".md", ".html")}
    assert {"summary.md", "report.html"} <= {p.name for p in pages}, sorted(pages)
    assert not any(_raw(text) for text in pages.values()), {p: _raw(t) for p, t in pages.items()}
    shown_in = {p.name for p, text in pages.items() if "\\x1b[2J" in text}  # the version, the tail
    assert shown_in == {"summary.md", "report.html"}, shown_in

    # a stale process whose name is hostile: status and gpu-clean name it
    fleet.write_inventory()
    holder, _pids = fleet.hold("h0", "--gpu", "0", "--mib", "1000", "--title",
                               "sglang::scheduler " + EVIL)  # fmt: skip
    try:
        said = cli("status", "status", "--hosts", "h0", expect=0)
        assert "sglang::scheduler \\x1b[2J" in said, said[-3000:]
        cli("gpu-clean --dry-run", "gpu-clean", "--dry-run", "--hosts", "h0", expect=0)
        cli("gpu-clean", "gpu-clean", "--hosts", "h0", expect=0)
    finally:
        holder.kill()
        holder.wait()
    found = {name: _raw(text) for name, text in outputs.items()}
    assert not any(found.values()), found
    record("terminal_filter", {"tasks": sorted(outputs), "raw_control_characters": 0})


def test_a_table_on_a_terminal_keeps_its_styling_and_filters_its_cells():
    """On a terminal rich draws tables with its own escape sequences, beside the filter
    (which would write them out); the cells, remote text among them, pass the filter."""
    import io

    from gpufleet.cli.output import table
    from gpufleet.cli.scrubbing import ScrubbingStream

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    terminal = Terminal()
    table("title " + EVIL, ["process"], [["sglang " + EVIL]], ScrubbingStream(terminal))
    drawn = terminal.getvalue()
    assert "\x1b[1m" in drawn or "\x1b[3m" in drawn, "rich's own styling is kept"
    assert "\x1b[2J" not in drawn and "\x1b]" not in drawn and "\x07" not in drawn
    assert drawn.count("\\x1b[2J") == 2, drawn
