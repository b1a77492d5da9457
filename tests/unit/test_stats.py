"""One mean ± std for the whole project: sample std (ddof = 1), NaN ignored."""
import math
import statistics

import numpy as np
import pytest

from dyntool.stats import mean_std


def test_sample_std_matches_the_statistics_module():
    xs = [746, 282, 345, 394, 522]
    m, s = mean_std(xs)
    assert m == pytest.approx(statistics.fmean(xs), rel=1e-15)
    assert s == pytest.approx(statistics.stdev(xs), rel=1e-14)          # ddof = 1, not pstdev
    assert s != pytest.approx(statistics.pstdev(xs))


def test_nan_ignored_single_value_zero_empty_nan():
    assert mean_std([1.0, float("nan"), 3.0]) == (2.0, pytest.approx(math.sqrt(2.0)))
    assert mean_std([5.0]) == (5.0, 0.0)
    m, s = mean_std([])
    assert math.isnan(m) and math.isnan(s)
    m, s = mean_std([float("nan")])
    assert math.isnan(m) and math.isnan(s)


def test_axis_zero_per_column():
    mat = np.array([[1.0, 2.0, np.nan], [3.0, np.nan, np.nan], [5.0, 4.0, 7.0]])
    m, s = mean_std(mat, axis=0)
    np.testing.assert_allclose(m, [3.0, 3.0, 7.0])
    np.testing.assert_allclose(s, [statistics.stdev([1, 3, 5]), statistics.stdev([2, 4]), 0.0])


def test_summaries_use_it():
    from dyntool.sims.summary import _mean_std
    assert _mean_std([1.0, 2.0, 4.0])["std"] == pytest.approx(statistics.stdev([1.0, 2.0, 4.0]))
    from dyntool.figures.common import mean_std as fig_mean_std
    np.testing.assert_allclose(fig_mean_std(np.array([[1.0], [2.0], [4.0]]))[1], [statistics.stdev([1, 2, 4])])
