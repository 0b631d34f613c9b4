"""Statistics of a figure measured on several models: mean, spread, confidence interval.

One training run's test accuracy is one sample from a noisy distribution (the
seed picks the initialisation and the shuffling). Trained as several seeds, it
is summarised here as the sample mean, the sample standard deviation (n - 1 in
the denominator), the range, and a 95% confidence interval of the mean from
Student's t distribution: mean ± t(0.975, n - 1) · s / √n. The interval assumes
the seeds' results are independent draws from a roughly normal distribution;
with one seed there is no spread to measure, and std and interval are None.

Two such figures are compared with Welch's t-test (`welch`: the difference of the
means, its 95% interval and a two-sided p-value, with no assumption that the two
spreads are equal), and a family of comparisons is corrected with Holm's step-down
method (`holm`), so that "significant at 5%" keeps its meaning however many pairs
are tested. `comparisons` runs both over chosen pairs of samples, `near_best`
marks the points of a sweep that are not significantly worse than its best, and
`format_comparison` says the result in words that cannot be misread.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

CONFIDENCE = 0.95
ALPHA = 0.05  # the significance level every verdict uses (p < ALPHA: significant)
NEEDS_SEEDS = "needs ≥2 seeds per run"


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


class NoTest(ValueError):
    """Two samples that no t-test can compare; the message says why, in a few words."""


class Welch(NamedTuple):
    """Welch's comparison of the means of samples a and b (floats as given, e.g. fractions)."""

    difference: float  # mean(a) - mean(b)
    ci95: tuple[float, float]  # the interval of the difference
    df: float  # Welch-Satterthwaite degrees of freedom; NaN when neither sample varies
    p: float  # two-sided p-value of "the means are equal"
    no_spread: bool  # neither sample varies: p is the limit, 1 (equal) or 0 (not)


def welch(a, b, confidence: float = CONFIDENCE) -> Welch:
    """Welch's unequal-variances t-test of mean(a) = mean(b), with the interval of the
    difference: `scipy.stats.ttest_ind(a, b, equal_var=False)` and its
    `confidence_interval(confidence)` (the tests compare them), through
    `scipy.special.stdtr`/`stdtrit` because scipy.stats is slow to import.

    `a`, `b`: 1-D sequences of floats. NoTest when either has fewer than two values
    (no spread to measure) or a value that is not finite (a diverged model). When
    neither varies the statistic is ±∞ or 0/0; the limits are returned instead
    (p = 1 for equal means, 0 for different ones) with `no_spread` set, where scipy
    returns NaN.
    """
    from scipy import special

    x = np.asarray(a, np.float64).reshape(-1)
    y = np.asarray(b, np.float64).reshape(-1)
    if x.size < 2 or y.size < 2:
        raise NoTest(NEEDS_SEEDS)
    if not (np.isfinite(x).all() and np.isfinite(y).all()):
        raise NoTest("a seed's value is not finite: a diverged model?")
    d = float(x.mean() - y.mean())
    va, vb = x.var(ddof=1) / x.size, y.var(ddof=1) / y.size
    se = math.sqrt(va + vb)
    if se == 0:
        return Welch(d, (d, d), math.nan, 1.0 if d == 0 else 0.0, True)
    df = float((va + vb) ** 2 / (va**2 / (x.size - 1) + vb**2 / (y.size - 1)))
    p = float(2 * special.stdtr(df, -abs(d) / se))
    half = float(special.stdtrit(df, 0.5 + confidence / 2)) * se
    return Welch(d, (d - half, d + half), df, min(p, 1.0), False)


def holm(p_values) -> np.ndarray:
    """Holm's step-down adjustment of a family of p-values, in the given order.

    The i-th smallest of m p-values is multiplied by m - i + 1 (i from 1), capped
    at 1 and made non-decreasing in that order; rejecting where the adjusted value
    is below α keeps the chance of any false "significant" in the family at most
    α, for any dependence between the tests. NaN entries (pairs with no test) stay
    NaN and do not count in m. statsmodels' `multipletests(method="holm")` does
    the same, but is not worth a dependency for these lines, and scipy has only
    Benjamini-Hochberg (`false_discovery_control`), which controls another rate.
    """
    p = np.asarray(p_values, np.float64).reshape(-1)
    out = np.full(p.shape, np.nan)
    tested = np.flatnonzero(~np.isnan(p))
    order = tested[np.argsort(p[tested], kind="stable")]
    m = order.size
    scaled = p[order] * (m - np.arange(m))
    out[order] = np.minimum(np.maximum.accumulate(scaled), 1.0)
    return out


class Comparison(NamedTuple):
    a: int  # index of the first sample (the difference is a - b)
    b: int
    n: tuple[int, int]  # how many values each had
    test: Welch | None  # None: no test, see `reason`
    reason: str | None
    p_holm: float | None  # Holm-adjusted over the family; None without a test
    family: int  # how many tests the family holds (Holm's m)

    @property
    def significant(self) -> bool | None:
        """Whether the difference is significant at 5% after Holm; None without a test."""
        return None if self.test is None else self.p_holm < ALPHA


def comparisons(samples, pairs) -> list[Comparison]:
    """Welch's test of each pair (i, j) of `samples` (sequences of floats), Holm-corrected
    over the pairs that could be tested."""
    tests, reasons = [], []
    for i, j in pairs:
        try:
            tests.append(welch(samples[i], samples[j]))
            reasons.append(None)
        except NoTest as e:
            tests.append(None)
            reasons.append(str(e))
    adjusted = holm([math.nan if t is None else t.p for t in tests])
    family = sum(t is not None for t in tests)
    return [
        Comparison(
            i,
            j,
            (len(samples[i]), len(samples[j])),
            t,
            r,
            None if t is None else float(q),
            family,
        )
        for (i, j), t, r, q in zip(pairs, tests, reasons, adjusted)
    ]


def best_index(samples) -> int:
    """The sample with the highest finite mean (the first of equals); 0 if none is finite."""
    means = [float(np.mean(s)) if len(s) else math.nan for s in samples]
    finite = [i for i, m in enumerate(means) if math.isfinite(m)]
    return max(finite, key=lambda i: (means[i], -i)) if finite else 0


# How far below the best a point may be and still count as about as good: half a
# percentage point of accuracy, the upper end of the difference's 95% interval.
NEAR_MARGIN = 0.005
CANT_TELL = "can't tell"


def near_best(samples, best: int | None = None) -> list[str]:
    """For each sample (e.g. one sweep point's per-seed accuracies, higher is better):
    "best" for the best one (`best`, or the highest mean), "no" when it is significantly
    worse than the best, "yes" when it is not and the 95% interval of its difference
    from the best ends within `NEAR_MARGIN`, "can't tell" when it is not significantly
    worse but the seeds leave room for more than that (too little power to say), "—"
    when no test applies (fewer than two values, or a non-finite one).

    Welch's test against the best, two-sided: the best is picked by looking at the
    means, so the direction of each difference is chosen by the data, and a one-sided
    p-value would halve p for a direction chosen after the fact. Holm-corrected over
    the comparisons with the best.
    """
    best = best_index(samples) if best is None else best
    marks = ["best" if i == best else "—" for i in range(len(samples))]
    for c in comparisons(samples, [(best, i) for i in range(len(samples)) if i != best]):
        if c.test is None:
            continue
        if c.significant and c.test.difference > 0:
            marks[c.b] = "no"
        else:
            marks[c.b] = "yes" if c.test.ci95[1] <= NEAR_MARGIN else CANT_TELL
    return marks


def near_best_legend(marks: list[str], what: str = "point") -> str:
    """The line that explains `near_best`'s `marks` under a table of them."""
    family = sum(m in ("yes", "no", CANT_TELL) for m in marks)
    if family == 0:
        return f"≈ best: not marked ({NEEDS_SEEDS.replace('run', what)}: --seeds N)"
    holm_text = f", Holm-corrected over the {family} comparisons" * (family > 1)
    needs = NEEDS_SEEDS.replace("run", what)
    untested = f"; — = no test ({needs}, every value finite)" * ("—" in marks)
    margin = f"{NEAR_MARGIN:.1%}".replace("%", " pp")
    cant = (
        f"; can't tell = not significantly worse, but its seeds leave room for more than "
        f"{margin} below" * (CANT_TELL in marks)
    )
    return (
        f"≈ best: yes = not significantly worse than the best {what} and within {margin} of "
        f"it (95% interval), no = significantly worse (Welch's t-test on the seeds, "
        f"two-sided, 5%{holm_text}){cant}{untested}"
    )


def format_p(p: float) -> str:
    """p with two significant digits, more where rounding would cross 5%: "0.08", "0.0496",
    "< 0.001"."""
    if p < 0.001:
        return "< 0.001"
    for digits in range(2, 7):
        text = f"{p:.{digits}g}"
        if (float(text) < ALPHA) == (p < ALPHA):
            return text
    return text


def _pp(x: float) -> str:
    """A difference of fractions in percentage points, signed: "+0.31", "−0.05"."""
    return f"{100 * x:+.2f}".replace("-", "−")


def verdict(c: Comparison, label_a: str, label_b: str) -> str:
    """What a comparison says, in words: "no significant difference at 5%", "a is
    significantly better than b at 5%", "no test (needs ≥2 seeds per run; a has 1)"."""
    t = c.test
    if t is None:
        counts = "; ".join(f"{label} has {n}" for label, n in zip((label_a, label_b), c.n) if n < 2)
        return f"no test ({c.reason}{'; ' + counts if counts else ''})"
    if t.no_spread and t.difference == 0:
        return "identical results on every seed, no difference"
    if not c.significant:
        return "no significant difference at 5%"
    better, worse = (label_a, label_b) if t.difference > 0 else (label_b, label_a)
    return f"{better} is significantly better than {worse} at 5%"


def format_comparison(c: Comparison, label_a: str, label_b: str) -> str:
    """One comparison on one line: "a − b = +0.31 pp [95% CI −0.05, +0.67], p = 0.08
    (Holm-adjusted 0.16): no significant difference at 5%"; "a vs b: no test (…)"."""
    words = verdict(c, label_a, label_b)
    t = c.test
    if t is None:
        return f"{label_a} vs {label_b}: {words}"
    head = f"{label_a} − {label_b} = {_pp(t.difference)} pp"
    if t.no_spread and t.difference != 0:
        head += " on every seed (neither run varies from seed to seed), p = 0"
    elif not t.no_spread:
        lo, hi = t.ci95
        head += f" [95% CI {_pp(lo)}, {_pp(hi)}], p {_p_text(t.p)}"
        if c.family > 1:
            head += f" (Holm-adjusted {format_p(c.p_holm)})"
    return f"{head}: {words}"


def _p_text(p: float) -> str:
    text = format_p(p)
    return text if text.startswith("<") else f"= {text}"
