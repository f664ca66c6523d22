"""Student's t at every number of repeats (issue 52): the 95% quantile the intervals use
follows the distribution past the table's 30 degrees of freedom instead of dropping to the
normal's 1.96 (t(31) = 2.040: intervals from 31 to about 120 samples were up to 4% narrow)."""

from __future__ import annotations

import itertools
import math

import pytest

from gpufleet.report.stats import mean_ci, t95

# Two-sided 95% quantiles, t(0.975, dof), from the standard tables (scipy.stats.t.ppf).
KNOWN = {1: 12.7062, 2: 4.3027, 5: 2.5706, 10: 2.2281, 20: 2.0860, 29: 2.0452, 30: 2.0423,
         31: 2.0395, 35: 2.0301, 40: 2.0211, 50: 2.0086, 60: 2.0003, 80: 1.9901,
         100: 1.9840, 120: 1.9799, 200: 1.9719, 500: 1.9647, 1000: 1.9623}  # fmt: skip


@pytest.mark.parametrize(("dof", "quantile"), sorted(KNOWN.items()))
def test_the_quantile_matches_the_table_of_known_values(dof, quantile):
    assert t95(dof) == pytest.approx(quantile, abs=6e-4)


def test_no_cliff_the_quantile_falls_smoothly_towards_the_normals():
    values = [t95(d) for d in range(1, 2001)]
    steps = [a - b for a, b in itertools.pairwise(values)]
    assert all(step > 0 for step in steps)  # always narrower with more repeats
    assert max(steps[29:]) < 0.003  # no jump at 30 -> 31 (it was 0.082)
    assert values[-1] > 1.959963984540054 and values[-1] == pytest.approx(
        1.96115, abs=1e-4
    )  # t(2000)


def test_an_interval_of_31_samples_is_as_wide_as_students_t_says():
    values = [100.0 + (i % 2) for i in range(32)]  # 31 degrees of freedom
    mean, _, high = mean_ci(values)
    sem = 0.5 * math.sqrt(32 / 31) / math.sqrt(32)  # stdev of the 0/1 pattern
    assert (high - mean) == pytest.approx(2.0395 * sem, rel=1e-3)
