"""Statistics of a figure measured on several models: mean, spread, confidence interval.

One training run's test accuracy is one sample from a noisy distribution (the
seed picks the initialisation and the shuffling). Trained as several seeds, it
is summarised here as the sample mean, the sample standard deviation (n - 1 in
the denominator), the range, and a 95% confidence interval of the mean from
Student's t distribution: mean ± t(0.975, n - 1) · s / √n. The interval assumes
the seeds' results are independent draws from a roughly normal distribution;
with one seed there is no spread to measure, and std and interval are None.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

CONFIDENCE = 0.95


class Spread(NamedTuple):
    n: int
    mean: float
    std: float | None  # sample standard deviation (ddof=1); None for n = 1
    sem: float | None  # standard error of the mean, std / sqrt(n)
    ci95: tuple[float, float] | None  # Student's t interval of the mean
    min: float
    max: float

    def to_json(self, prefix: str) -> dict:
        """{prefix_mean, prefix_std, prefix_ci95: [low, high], prefix_min, prefix_max}."""
        return {
            f"{prefix}_mean": self.mean,
            f"{prefix}_std": self.std,
            f"{prefix}_ci95": list(self.ci95) if self.ci95 is not None else None,
            f"{prefix}_min": self.min,
            f"{prefix}_max": self.max,
        }


def t_quantile(n: int, confidence: float = CONFIDENCE) -> float:
    """The two-sided Student's t quantile for a mean of `n` samples (n - 1 degrees of freedom).

    `scipy.special.stdtrit(df, p)` is the routine behind `scipy.stats.t.ppf(p, df)`
    (same values; the tests compare them); scipy.stats is much slower to import.
    """
    from scipy import special

    return float(special.stdtrit(n - 1, 0.5 + confidence / 2))


def spread(values) -> Spread:
    """Summarises a 1-D sequence of finite or non-finite floats (a diverged model's
    NaN loss makes the figures NaN rather than being silently dropped)."""
    x = np.asarray(values, np.float64).reshape(-1)
    if x.size == 0:
        raise ValueError("spread of no values")
    mean = float(x.mean())
    if x.size == 1:
        return Spread(1, mean, None, None, None, float(x[0]), float(x[0]))
    std = float(x.std(ddof=1))
    sem = std / math.sqrt(x.size)
    half = t_quantile(x.size) * sem
    return Spread(
        x.size, mean, std, sem, (mean - half, mean + half), float(x.min()), float(x.max())
    )


def format_spread(s: Spread, percent: bool = True) -> str:
    """e.g. "97.61% ± 0.08% (95% CI 97.54–97.68%, n=8)"; one value: "97.61% (n=1)"."""

    def f(v: float) -> str:
        return f"{100 * v:.2f}" if percent else f"{v:.4f}"

    unit = "%" if percent else ""
    if s.std is None:
        return f"{f(s.mean)}{unit} (n=1)"
    lo, hi = s.ci95
    return f"{f(s.mean)}{unit} ± {f(s.std)}{unit} (95% CI {f(lo)}–{f(hi)}{unit}, n={s.n})"
