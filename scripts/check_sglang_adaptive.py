"""Do the profiles `inv tune` writes start on the real SGLang? Run in a throwaway venv that
has SGLang (never a gpufleet dependency), from the repository root:

    python3 -m venv /tmp/sgl && /tmp/sgl/bin/pip install sglang==0.5.23
    PYTHONPATH=src /tmp/sgl/bin/python scripts/check_sglang_adaptive.py

It writes tuned profiles with gpufleet's own writer (control/tune/files.py) for the shapes the
tests produce, then puts each through SGLang's start-up path: `prepare_server_args` on the
profile's flags, the adaptive hook that refuses a starting depth outside the table
(`_init_adaptive_speculative_params`) and `AdaptiveSpeculativeParams`. It also feeds the
forms SGLang must refuse, and checks that gpufleet's rehearsal server refuses the same ones.
Prints one line per case; exits 1 if SGLang and the rehearsal engine disagree anywhere.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
from pathlib import Path

import yaml

logging.disable(logging.WARNING)

from gpufleet.control.tune import files as tunefiles  # noqa: E402
from gpufleet.control.tune import table as tune  # noqa: E402
from gpufleet.records import ResultRow  # noqa: E402
from gpufleet.sim.speculation import AdaptiveDepth, initial_steps  # noqa: E402


def _rows(table):
    return {d: {c: [ResultRow(c, 10, 0, t, median_per_request_output_tps=p)]
                for c, (t, p) in levels.items()} for d, levels in table.items()}  # fmt: skip


MEASURED = {  # depth -> C -> (total tok/s, per-request tok/s), the shapes tests/test_tune.py uses
    "depth 0 wins at batch 1, depth 3 from 8": {
        0: {1: (90, 90), 8: (400, 50)},
        3: {1: (80, 80), 8: (500, 62)},
    },
    "depth 3, then 1, then 0": {
        0: {1: (60, 60), 4: (200, 50), 16: (480, 30), 64: (780, 12)},
        1: {1: (77, 77), 4: (220, 55), 16: (400, 25), 64: (480, 7.5)},
        3: {1: (80, 80), 4: (190, 48), 16: (280, 18), 64: (340, 5.3)},
    },
    "depth 0 everywhere": {0: {1: (90, 90), 8: (400, 50)}, 2: {1: (70, 70), 8: (300, 37)}},
    "the 16-core calibrated tune (README): 2, 3, 2, then 0 from batch 6": {
        0: {1: (60, 60), 2: (109, 55), 4: (194, 49), 8: (319, 40), 64: (737, 11.5)},
        2: {1: (82, 82), 2: (138, 69), 4: (226, 57), 8: (323, 40), 64: (535, 8.4)},
        3: {1: (82, 82), 2: (143, 72), 4: (208, 52), 8: (309, 39), 64: (519, 8.1)},
    },
}
REFUSED = {  # table, starting depth: what an older writer or the old docs produced
    "old writer: {1:[0]} started at depth 1": ({"1": {"candidate_steps": [0]}}, 1),
    "shorthand table of the old docs": ({"1": [2], "8": [0]}, 2),
}


def sglang_verdict(config: str, flags: dict) -> str:
    from sglang.srt.arg_groups.speculative_hook import _init_adaptive_speculative_params
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.speculative.adaptive_spec_params import AdaptiveSpeculativeParams

    argv = ["--model-path", "Qwen/Qwen2.5-0.5B-Instruct", "--speculative-algorithm", "EAGLE3",
            "--speculative-draft-model-path", "x/eagle3", "--speculative-adaptive",
            "--speculative-adaptive-config", config]  # fmt: skip
    for flag, value in flags.items():
        argv += [f"--{flag}", str(value)]
    try:
        args = prepare_server_args(argv)
        _init_adaptive_speculative_params(args)
        params = AdaptiveSpeculativeParams(args.speculative_num_steps, config)
        return f"accepted (starts at {args.speculative_num_steps}, batch 1 runs depth " \
               f"{params.get_steps_for_batch(1)})"  # fmt: skip
    except Exception as exc:
        return f"refused: {type(exc).__name__}: {str(exc).splitlines()[0]}"


def rehearsal_verdict(config: str, start: int) -> str:
    try:
        AdaptiveDepth(initial_steps(start, config), config)
        return "accepted"
    except Exception as exc:
        return f"refused: {type(exc).__name__}: {exc}"


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="sgl-check-"))
    os.chdir(work)
    (work / "playbooks").mkdir()
    (work / "playbooks" / "spec.yaml").write_text("model_path: /m\n")
    disagree = 0
    cases = []
    for name, measured in MEASURED.items():
        result = tune.choose(_rows(measured))
        name = "t" + str(len(cases))
        config, profile = tunefiles.write_outputs("playbooks/spec.yaml", result, name)
        flags = yaml.safe_load(profile.read_text())["flags"]
        keep = {k: v for k, v in flags.items() if k.startswith("speculative-") and
                k not in ("speculative-adaptive", "speculative-adaptive-config")}  # fmt: skip
        cases.append((f"tuned: {name}", str(config), keep, True))
    for name, (table, start) in REFUSED.items():
        config = work / f"r{len(cases)}.json"
        config.write_text(json.dumps(table))
        keep = {"speculative-eagle-topk": 1, "speculative-num-steps": start}
        cases.append((name, str(config), keep, False))
    for name, config, flags, should_start in cases:
        sglang = sglang_verdict(config, flags)
        rehearsal = rehearsal_verdict(config, int(flags["speculative-num-steps"]))
        same = sglang.startswith("accepted") == rehearsal.startswith("accepted") == should_start
        disagree += not same
        table = json.loads(Path(config).read_text())
        print(f"{'ok  ' if same else 'DIFF'} {name}: table {json.dumps(table)}, "
              f"--speculative-num-steps {flags['speculative-num-steps']}\n"
              f"     SGLang: {sglang}\n     rehearsal: {rehearsal}")  # fmt: skip
    return 1 if disagree else 0


if __name__ == "__main__":
    sys.exit(main())
