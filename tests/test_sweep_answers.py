"""A sweep answers for every profile, and compare reads what the sweep measured (issue 53,
bullets 4 and 5): a sweep of a target and three drafts printed one sentence, about the first
draft; `inv compare target draftA` after a `--repeat 3` sweep read one run per arm and asked
for `--repeat 3`, the thing just done."""

from __future__ import annotations

import html
import json
import re

import pytest

from gpufleet.archive import store
from gpufleet.archive.kept import Cell, Manifest, SweepRecord
from gpufleet.archive.layout import Archive
from gpufleet.cli.sweep_tasks import reference_first
from gpufleet.errors import UserError
from gpufleet.report import answer, select
from helpers import run_cli, unwrap

# per profile, (output tok/s, per-request tok/s) at C=1 and C=16
FIGURES = {
    "target": {1: (100.0, 100.0), 16: (900.0, 56.0)},
    "draftA": {1: (150.0, 150.0), 16: (700.0, 44.0)},
    "draftB": {1: (130.0, 130.0), 16: (950.0, 60.0)},
    "draftC": {1: (70.0, 70.0), 16: (500.0, 31.0)},
}


def _run(root, run_id: str, profile: str, jitter: float = 0.0) -> None:
    rows = [
        {"max_concurrency": c, "repeat": 1, "request_rate": float("inf"),
         "output_throughput": tot * (1 + jitter), "median_per_request_output_tps": per * (1 + jitter),
         "median_ttft_ms": 40.0, "completed": 16, "failed": 0, "level_status": "ok"}
        for c, (tot, per) in FIGURES[profile].items()
    ]  # fmt: skip
    manifest = {
        "run_id": run_id, "host": "h0", "profile": profile, "status": "done",
        "started_at": "2026-12-03T10:00:00+00:00",
        "plan": {"run_id": run_id, "levels": [], "output_len": 64, "backend": "sglang"},
        "prompt_set": {"prompts_sha256": "abc"},
        "levels": [{"concurrency": c, "output_throughput": t} for c, (t, _) in FIGURES[profile].items()],
    }  # fmt: skip
    files = {"results.jsonl": "".join(json.dumps(r) + "\n" for r in rows).encode()}
    store.write_run(Archive(root), "h0", run_id, files, Manifest.from_wire(manifest))


def _sweep(root, profiles: list[str], repeats: int) -> str:
    """A finished sweep of these profiles, `repeats` interleaved runs of each, as the
    sweep's state file records it."""
    cells, arms = {}, []
    for k in range(1, repeats + 1):
        for n, profile in enumerate(profiles):
            key = profile if k == 1 else f"{profile}#{k}"
            run_id = f"20261203-10{k}{n}00-{profile}"
            _run(root, run_id, profile, jitter=0.01 * (k - 2))
            cells[key] = {"h0": Cell(status="done", run_id=run_id)}
            arms.append({"key": key, "profile": profile, "label": profile, "repeat": k})
    sweep_id = "20261203-100000-sweep"
    record = SweepRecord(sweep_id, profiles, ["h0"], [1, 16], cells, arms=arms, status="done")
    Archive(root).sweeps_dir.mkdir(parents=True, exist_ok=True)
    Archive(root).sweep_state(sweep_id).write_text(record.to_json())
    return sweep_id


def _page_text(page: str) -> str:
    text = re.sub(r"<(script|style)\b.*?</\1>", " ", page, flags=re.S)
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", text)).split())


def test_every_profile_gets_its_sentence_in_every_rendering(tmp_path):
    root = tmp_path / "logs"
    for n, profile in enumerate(FIGURES):
        _run(root, f"2026120{n}-r-{profile}", profile)
    names = list(FIGURES)
    out = run_cli("compare", *names[:2], "--more", ",".join(names[2:]), "--archive", str(root),
                  "--no-plots")  # fmt: skip
    assert out.returncode == 0, out.stderr
    said = answer.build("h0", select.report_for_runs(Archive(root), names).per_host["h0"])
    assert len(said.sentences) == 3
    for draft, text in zip(names[1:], said.sentences, strict=True):
        assert draft in text and not any(d in text for d in names[1:] if d != draft), text
    folder = root / "compare" / "-vs-".join(names)
    renderings = {
        "terminal": " ".join(unwrap(out.stdout).split()),
        "summary.md": " ".join((folder / "summary.md").read_text().split()),
        "report.html": _page_text((folder / "report.html").read_text()),
    }
    for name, text in renderings.items():
        for sentence in said.sentences:
            assert " ".join(sentence.split()) in text, (name, sentence)


def test_baseline_puts_the_reference_first_and_refuses_a_stranger():
    assert reference_first(["target", "a", "b"], None) == ["target", "a", "b"]
    assert reference_first(["target", "a", "b"], "b") == ["b", "target", "a"]
    with pytest.raises(UserError, match=r"--baseline z: not one of --profiles \(target, a\)"):
        reference_first(["target", "a"], "z")


def test_compare_after_a_repeated_sweep_reads_every_repeat_and_names_the_sweep(tmp_path):
    root = tmp_path / "logs"
    sweep_id = _sweep(root, ["target", "draftA"], repeats=3)
    out = run_cli("compare", "target", "draftA", "--archive", str(root), "--no-plots")
    assert out.returncode == 0, out.stderr
    text = unwrap(out.stdout)
    assert f"target: every repeat of sweep {sweep_id} (3 runs)" in text
    assert f"draftA: every repeat of sweep {sweep_id} (3 runs)" in text
    assert "--repeat 3 gives" not in text
    assert re.search(r"\d\.\d+x \[\d\.\d+-\d\.\d+\]", text), text  # ratios with intervals
    arms = select.report_for_runs(Archive(root), ["target", "draftA"]).per_host["h0"]
    assert [arm.levels[1].repeats for arm in arms] == [3, 3]


def test_the_repeat_hint_appears_only_where_there_was_one_run(tmp_path):
    root = tmp_path / "logs"
    _sweep(root, ["target", "draftA"], repeats=1)
    out = run_cli("compare", "target", "draftA", "--archive", str(root), "--no-plots")
    assert out.returncode == 0, out.stderr
    assert "one run per arm, so no interval: --repeat 3 gives each figure one" in unwrap(out.stdout)
    assert "every repeat of sweep" not in out.stdout
