"""Seed statistics against a NumPy/SciPy reference."""

import numpy as np
import pytest
from scipy import stats as scipy_stats

from jaxmnist import stats


@pytest.mark.parametrize("n", [2, 3, 5, 8, 30])
def test_spread_matches_numpy_and_scipy(n):
    x = np.random.default_rng(n).normal(0.975, 0.002, n)
    s = stats.spread(x)
    assert s.n == n
    assert s.mean == pytest.approx(np.mean(x), rel=1e-12)
    assert s.std == pytest.approx(np.std(x, ddof=1), rel=1e-12)
    assert s.sem == pytest.approx(scipy_stats.sem(x), rel=1e-12)
    lo, hi = scipy_stats.t.interval(0.95, n - 1, loc=np.mean(x), scale=scipy_stats.sem(x))
    assert s.ci95 == pytest.approx((lo, hi), rel=1e-12)
    assert (s.min, s.max) == (x.min(), x.max())


def test_known_quantiles():
    # Student's t tables: t(0.975, 1) = 12.706, t(0.975, 7) = 2.365, large n -> 1.960.
    assert stats.t_quantile(2) == pytest.approx(12.7062, abs=1e-4)
    assert stats.t_quantile(8) == pytest.approx(2.3646, abs=1e-4)
    assert stats.t_quantile(10_000) == pytest.approx(1.9602, abs=1e-3)


def test_one_value_has_no_spread_and_json_keys():
    s = stats.spread([0.97])
    assert s.std is None and s.ci95 is None and s.mean == s.min == s.max == 0.97
    assert stats.format_spread(s) == "97.00% (n=1)"
    assert stats.spread([0.97, 0.98]).to_json("test_accuracy").keys() == {
        "test_accuracy_mean",
        "test_accuracy_std",
        "test_accuracy_ci95",
        "test_accuracy_min",
        "test_accuracy_max",
    }
    assert stats.spread([0.97]).to_json("a")["a_ci95"] is None


def test_format_spread():
    text = stats.format_spread(stats.spread([0.97, 0.975, 0.98]))
    assert text == "97.50% ± 0.50% (95% CI 96.26–98.74%, n=3)"
    with pytest.raises(ValueError):
        stats.spread([])
