"""`--engine sglang-bench` through a real SGLang's bench_serving (issue 82, bullet 5): a
host whose Python has SGLang runs each level through the client's registered level
function, over the real loopback sshd against the rehearsal server. SGLang is large and
not part of the suite's environment: the test runs where a venv holding it is given
(GPUFLEET_SGLANG_PYTHON, default /tmp/sglvenv/bin/python), and says so where it is not."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from helpers import Fleet, stop_launched
from test_reliability import record

SGLANG_PYTHON = os.environ.get("GPUFLEET_SGLANG_PYTHON", "/tmp/sglvenv/bin/python")


def _tokenizer(python: str, where: Path) -> Path:
    """A tiny word-level tokenizer saved as a Hugging Face folder (bench_serving tokenizes
    its prompts; no network here)."""
    script = f"""
import string
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
vocab = {{"<unk>": 0, "<s>": 1, "</s>": 2}}
for w in [*string.ascii_letters, *string.digits, *string.punctuation]:
    vocab.setdefault(w, len(vocab))
tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
tok.pre_tokenizer = pre_tokenizers.Whitespace()
PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                        eos_token="</s>").save_pretrained({str(where)!r})
"""
    subprocess.run([python, "-c", script], check=True, timeout=300)
    return where


@pytest.mark.slow(minutes=4)
def test_a_level_through_sglangs_own_bench_serving_is_archived(tmp_path, sshd_hosts, ssh_keys):
    if not Path(SGLANG_PYTHON).exists():
        pytest.skip(f"no Python with SGLang at {SGLANG_PYTHON} (GPUFLEET_SGLANG_PYTHON)")
    fleet = Fleet(tmp_path, sshd_hosts, ssh_keys, SGLANG_PYTHON)
    tokenizer = _tokenizer(SGLANG_PYTHON, tmp_path / "tokenizer")
    profile = fleet.profile("sgl", tp=1, sim={"load-seconds": 0.3, "warmup-seconds": 0.1})
    try:
        out = fleet.cli("launch", "--profile", str(profile), "--hosts", "h0")
        assert out.returncode == 0, out.stdout + out.stderr
        out = fleet.cli("bench", "--profile", str(profile), "--hosts", "h0", "--engine",
                        "sglang-bench", "--tokenizer", str(tokenizer), "-c", "1,2",
                        "--num-prompts", "4", "--output-len", "16", "--archive",
                        str(tmp_path / "archive"), timeout=400)  # fmt: skip
        said = out.stdout + out.stderr
        assert out.returncode == 0, said
        [run] = (tmp_path / "archive" / "h0").iterdir()
        rows = [json.loads(x) for x in (run / "results.jsonl").read_text().splitlines()]
        assert [r["max_concurrency"] for r in rows] == [1, 2], rows
        assert all(r["engine"] == "sglang-bench" and r["completed"] == 4 for r in rows), rows
        record("sglang-bench real", {"levels": len(rows),
                                     "completed": [r["completed"] for r in rows]})  # fmt: skip
    finally:
        fleet.cli("stop", "--hosts", "h0", "--grace", "1")
        stop_launched(fleet.root)
