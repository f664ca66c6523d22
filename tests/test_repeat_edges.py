"""Issue 79, adversarial pass one level up: a level's repeats as one, whichever repeat
failed. Before: the level's status and its token-count basis were the last repeat's alone,
so a failed first repeat read `ok` and a failed last one read `failed` with no ITL basis."""

from __future__ import annotations

import pytest

from gpufleet.records import ResultRow
from gpufleet.report.stats import aggregate
from test_nothing_measured import _row


@pytest.mark.parametrize("failed", [0, 1, 2])
def test_whichever_repeat_failed_the_level_reads_the_same(failed):
    rows = [ResultRow.from_wire(_row(4, k + 1, ok=k != failed, itl_basis="token"))
            for k in range(3)]  # fmt: skip
    for r in rows:
        if not r.completed:
            r.itl_basis = None  # a repeat that measured nothing has no basis
    level = aggregate(rows)
    assert (level.measured, level.get("level_status"), level.get("itl_basis")) == (
        2, "failed", "token")  # fmt: skip
    assert level.get("median_ttft_ms") == 204.0 and level.get("failed") == 8


def test_repeats_all_ok_read_ok():
    level = aggregate([ResultRow.from_wire(_row(4, k + 1)) for k in range(3)])
    assert level.get("level_status") == "ok" and level.measured == 3
