"""Issue 79, the token count's note in every rendering: where a level's counts disagreed or
were approximated (results.jsonl's output_tokens_note, output_tokens_source, itl_basis), the
run's notes (terminal, summary.md), compare's notices (terminal, summary.md, report.html) say
so once per arm with the source the figures came from; a note only an earlier repeat raised
is kept; an arm counting chunks is named in the sentence; ITL per chunk beside per token is
said. Before: the note was in results.jsonl alone."""

from __future__ import annotations

import habits_app
from gpufleet.archive.kept import Manifest
from gpufleet.archive.layout import Archive
from gpufleet.records import ResultRow
from gpufleet.report import answer, select, tables
from gpufleet.report.stats import aggregate
from gpufleet.sim.sshd import free_port
from helpers import run_cli, unwrap
from test_nothing_measured import _row, _run

MANIFEST = Manifest.from_wire({"run_id": "r", "host": "h0", "profile": "p", "status": "done"})
APPROX = {"output_tokens_source": "chunks", "itl_basis": "chunk"}


def _approximated(c: int, k: int, chunks: int) -> dict:
    note = (f"3 of 3 requests: server usage {chunks * 6} above max_tokens {chunks * 4}; "
            f"counted the {chunks} chunks instead (an approximation)")  # fmt: skip
    return _row(c, k, output_tokens_note=note, **APPROX)


def test_a_token_note_is_one_line_per_arm_naming_its_source_in_every_rendering(tmp_path):
    rows = [
        _approximated(1, 1, 40),
        _approximated(1, 2, 41),
        _approximated(4, 1, 40),
        _row(4, 2, **APPROX),
    ]  # fmt: skip  (only C=4's first repeat said it)
    results = [ResultRow.from_wire(r) for r in rows]
    said = [n for n in tables.level_notes(results) if "output tokens" in n]
    assert said == ["C=1,4: output tokens from chunks: 3 of 3 requests: server usage 240-246 "
                    "above max_tokens 160-164; counted the 40-41 chunks instead (an "
                    "approximation)"], said  # fmt: skip
    assert tables.summary_md(MANIFEST, results).count("output tokens from chunks") == 1
    # a level's repeats as one: the note of the first repeat is not lost with the last's
    level = aggregate(results[2:])
    assert "counted the 40 chunks" in (level.get("output_tokens_note") or "")
    assert level.get("itl_basis") == "chunk"
    root = tmp_path / "logs"
    _run(root, "r1-base", "base", [_row(c, k, output_tokens_source="usage", itl_basis="token")
                                   for c in (1, 4) for k in (1, 2)])  # fmt: skip
    _run(root, "r2-chunky", "chunky", rows)
    out = run_cli("compare", "base", "chunky", "--archive", str(root), "--no-plots")
    assert out.returncode == 0, out.stderr
    text = " ".join(unwrap(out.stdout).split())
    assert text.count("output tokens from chunks") == 1, text
    assert "chunky: at C=1,4 output tokens from chunks: 3 of 3 requests" in text
    assert "ITL per chunk in chunky, per token in base at C=1,4" in text
    assert "but chunky at C=1,4 counted the chunks, not the tokens" in text
    [folder] = (root / "compare").iterdir()
    for page in ("summary.md", "report.html"):
        found = " ".join((folder / page).read_text().split())
        assert found.count("output tokens from chunks") == 1, page
        assert found.count("ITL per chunk in chunky") == 1, page
    data = select.report_for_runs(Archive(root), ["base", "chunky"])
    same = answer.build("h0", [data.per_host["h0"][0], data.per_host["h0"][0]])
    assert not [n for n in same.notices if n.topic == "tokens"]  # one basis: nothing said


def test_bench_client_local_prints_the_note_a_lying_server_earned(tmp_path):
    """The habits server's `over` habit (usage half as large again as max_tokens), no
    tokenizer: the run's notes on the terminal and in summary.md name the chunks as the
    source and both figures."""
    port = free_port()
    server = habits_app.start(port)
    try:
        out = run_cli("bench", "--client", "local", "--url",
                      f"http://127.0.0.1:{port}/h/over/4/20", "--backend", "openai",
                      "--archive", str(tmp_path / "a"), "--concurrency", "1,2",
                      "--num-prompts", "3", "--output-len", "16", "--repeat", "2")  # fmt: skip
    finally:
        server.terminate()
        server.wait(10)
    assert out.returncode == 0, out.stderr
    text = " ".join(unwrap(out.stdout).split())
    expected = ("C=1,2: output tokens from chunks: 3 of 3 requests: server usage 24 above "
                "max_tokens 16; counted the 4 chunks instead (an approximation)")  # fmt: skip
    assert text.count(expected) == 1, text
    [summary] = (tmp_path / "a").glob("*/*/summary.md")
    assert " ".join(summary.read_text().split()).count(expected) == 1
    assert "ITL per chunk in 3 of 3 requests" in text
