"""Record SGLang's own adaptive slot on random inputs, for tests/test_tune.py to replay
against the rehearsal's (sim/speculation.AdaptiveSlot).

SGLang's module imports half of its server; its AdaptiveStepSlot needs only `math` and a
log call, so the class is taken from the installed file and run alone:

    python3 -m venv /tmp/sgl && /tmp/sgl/bin/pip install sglang==0.5.23   # or pip download
    python3 scripts/record_sglang_slot.py /tmp/sgl/lib/python3.11/site-packages/sglang
"""

from __future__ import annotations

import ast
import json
import math
import random
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "sglang-0.5.23-adaptive-slot.json"


def main(package: str) -> None:
    path = Path(package) / "srt" / "speculative" / "adaptive_spec_params.py"
    source = path.read_text()
    [cls] = [n for n in ast.parse(source).body
             if isinstance(n, ast.ClassDef) and n.name == "AdaptiveStepSlot"]  # fmt: skip
    scope = {"math": math, "log_info_on_rank0": lambda *a, **k: None, "logger": None}
    exec(ast.get_source_segment(source, cls), scope)  # noqa: S102 - SGLang's own class
    slot_class = scope["AdaptiveStepSlot"]
    rng = random.Random(63)
    cases = []
    for _ in range(40):
        config = {
            "candidate_steps": sorted(rng.sample(range(8), rng.randint(1, 4))),
            "ema_alpha": rng.choice([0.1, 0.2, 0.5]),
            "update_interval": rng.choice([1, 2, 5]),
            "warmup_batches": rng.choice([0, 3, 10]),
            "down_hysteresis": rng.choice([-0.25, 0.0, 0.25]),
            "up_hysteresis": rng.choice([0.0, 0.25]),
            "ceiling_coeff": rng.choice([0, 0, 0.8, 1.0, 1.5]),
        }
        initial = rng.choice(range(8))
        slot = slot_class(initial, config)
        accepted, steps = [], []
        for _ in range(60):
            top = max(1, slot.current_steps)
            batch = [rng.randint(0, top) for _ in range(rng.randint(0, 4))]
            slot.update(batch)
            accepted.append(batch)
            steps.append(slot.current_steps)
        cases.append({"initial": initial, "config": config, "accepted": accepted, "steps": steps})
    note = f"SGLang's AdaptiveStepSlot ({path.name}) on these inputs: scripts/record_sglang_slot.py"
    OUT.write_text(json.dumps({"source": note, "cases": cases}) + "\n")
    print(f"{len(cases)} cases -> {OUT}")


if __name__ == "__main__":
    main(sys.argv[1])
