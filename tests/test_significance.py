"""Significance: Welch's test and Holm's correction against SciPy and a hand-worked example,
and the words `compare` and the sweep table say with them."""

import json
import math
import re
import shutil

import numpy as np
import pytest
from scipy import stats as scipy_stats

from jaxmnist import stats
from jaxmnist.cli import main
from jaxmnist.report import sweep_report
from jaxmnist.search import sweep

# (a, b): equal sizes, unequal sizes, unequal spreads, a negative difference, large n.
SAMPLES = [
    ([0.975, 0.978, 0.976, 0.979], [0.970, 0.974, 0.969, 0.972]),
    ([0.981, 0.979, 0.983], [0.978, 0.975, 0.980, 0.977, 0.979, 0.976, 0.974, 0.981]),
    ([0.90, 0.95, 0.85, 0.99, 0.93], [0.951, 0.952, 0.950]),
    ([0.97, 0.971], [0.975, 0.9755, 0.976, 0.9745]),
    (
        list(np.random.default_rng(0).normal(0.98, 0.002, 40)),
        list(np.random.default_rng(1).normal(0.979, 0.004, 25)),
    ),
]


@pytest.mark.parametrize("a, b", SAMPLES)
def test_welch_matches_scipy_ttest_ind(a, b):
    w = stats.welch(a, b)
    ref = scipy_stats.ttest_ind(a, b, equal_var=False)
    ci = ref.confidence_interval(0.95)
    assert w.difference == pytest.approx(np.mean(a) - np.mean(b), rel=1e-12)
    assert w.df == pytest.approx(ref.df, rel=1e-10)
    assert w.p == pytest.approx(ref.pvalue, rel=1e-9)
    assert w.ci95 == pytest.approx((ci.low, ci.high), rel=1e-9)
    assert not w.no_spread
    swapped = stats.welch(b, a)  # the same test, the other way round
    assert swapped.p == pytest.approx(w.p, rel=1e-12)
    assert swapped.ci95 == pytest.approx((-w.ci95[1], -w.ci95[0]), rel=1e-12)


def test_welch_edge_cases():
    for a, b in (([0.97], [0.98, 0.99]), ([0.97, 0.98], [0.99])):
        with pytest.raises(stats.NoTest, match="needs ≥2 seeds per run"):
            stats.welch(a, b)
    with pytest.raises(stats.NoTest, match="not finite"):
        stats.welch([0.97, math.nan], [0.98, 0.99])
    # Neither varies: scipy's statistic is 0/0 or ±inf; the limits, flagged.
    same = stats.welch([0.9, 0.9], [0.9, 0.9, 0.9])
    assert same.p == 1.0 and same.difference == 0 and same.ci95 == (0, 0) and same.no_spread
    apart = stats.welch([0.91, 0.91], [0.9, 0.9])
    assert apart.p == 0.0 and apart.difference == pytest.approx(0.01) and apart.no_spread
    # One of the two varies: an ordinary test, whose degrees of freedom are the varying
    # sample's n - 1 (scipy warns of a constant sample here, so the reference is by hand).
    one = stats.welch([0.91, 0.91, 0.91], [0.9, 0.905, 0.895])
    se = np.std([0.9, 0.905, 0.895], ddof=1) / math.sqrt(3)
    assert not one.no_spread and one.df == pytest.approx(2)
    assert one.p == pytest.approx(2 * scipy_stats.t.sf(0.01 / se, 2), rel=1e-9)


def test_holm_hand_worked_and_monotone():
    # m = 4, sorted: 0.005·4 = 0.02, 0.01·3 = 0.03, 0.03·2 = 0.06, 0.04·1 = 0.04 → 0.06
    # (the running maximum).
    np.testing.assert_allclose(stats.holm([0.01, 0.04, 0.03, 0.005]), [0.03, 0.06, 0.06, 0.02])
    # Untested pairs (NaN) stay NaN and do not count in m; values are capped at 1.
    np.testing.assert_allclose(stats.holm([0.01, math.nan, 0.04]), [0.02, math.nan, 0.04])
    np.testing.assert_allclose(stats.holm([0.5, 0.6]), [1.0, 1.0])
    np.testing.assert_allclose(stats.holm([0.02]), [0.02])  # a family of one: unchanged
    p = np.random.default_rng(3).uniform(0, 0.2, 12)
    q = stats.holm(p)
    order = np.argsort(p)
    assert (q >= p).all() and (q <= 1).all()
    assert (np.diff(q[order]) >= 0).all()  # a smaller p never gets a larger adjusted p
    assert q[order[0]] == pytest.approx(12 * p[order[0]])


def test_p_values_are_written_so_that_rounding_never_crosses_five_percent():
    assert stats.format_p(0.0812) == "0.081"
    assert stats.format_p(0.0496) == "0.0496"  # not "0.05" beside "significant"
    assert stats.format_p(0.0504) == "0.05"  # not below 5% either way
    assert stats.format_p(0.0004) == "< 0.001"
    assert stats.format_p(1.0) == "1"


# --- compare ---------------------------------------------------------------------------

A = [0.980, 0.981, 0.982, 0.979]
B = [0.970, 0.971, 0.969, 0.972]  # 1 pp below A: significant
C = [0.9805, 0.979, 0.981, 0.982]  # beside A: not


def fake_run(template, path, accuracies):
    """A copy of a finished run whose summary says it trained `accuracies` (one per seed)."""
    shutil.copytree(template, path, ignore=shutil.ignore_patterns("report.html", "plots"))
    summary = json.loads((path / "summary.json").read_text())
    summary.update(test_accuracy=float(np.mean(accuracies)))
    if len(accuracies) > 1:
        summary.update(
            seeds=list(range(len(accuracies))),
            test_accuracy_per_seed=list(accuracies),
            **stats.spread(accuracies).to_json("test_accuracy"),
        )
    (path / "summary.json").write_text(json.dumps(summary))
    return path


def compare(tmp_path, capsys, runs: dict) -> tuple[list[str], str]:
    """`jaxmnist compare` of runs named as `runs`' keys: (its stdout lines, the page)."""
    dirs = [str(fake_run(template, tmp_path / name, acc)) for name, (template, acc) in runs.items()]
    out = tmp_path / "comparison.html"
    assert main(["compare", *dirs, "--out", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == str(out)
    return lines, out.read_text()


def test_compare_says_which_pair_differs(tiny_model_run, tmp_path, capsys):
    lines, page = compare(tmp_path, capsys, {"b": (tiny_model_run, B), "a": (tiny_model_run, A)})
    assert lines[0].startswith("b  97.05% ± 0.13% (95% CI") and lines[1].startswith("a  98.05%")
    assert lines[2] == "Test accuracy, every pair (Welch's t-test on the seeds, two-sided, 5%):"
    # The higher mean first, whatever the order given; figures from scipy.stats.ttest_ind.
    assert lines[3] == (
        "  a − b = +1.00 pp [95% CI +0.78, +1.22], p < 0.001: "
        "a is significantly better than b at 5%"
    )
    assert len(lines) == 5 and "Holm" not in "".join(lines)
    assert 'id="significance"' in page
    assert "a is significantly better than b at 5%" in page and "+0.78, +1.22 pp" in page


def test_compare_says_no_significant_difference(tiny_model_run, tmp_path, capsys):
    lines, page = compare(tmp_path, capsys, {"a": (tiny_model_run, A), "c": (tiny_model_run, C)})
    ref = scipy_stats.ttest_ind(C, A, equal_var=False)
    assert round(ref.pvalue, 2) == 0.89
    assert lines[3] == (
        "  c − a = +0.01 pp [95% CI −0.21, +0.23], p = 0.89: no significant difference at 5%"
    )
    assert "no significant difference at 5%" in page


def test_compare_of_three_runs_is_holm_corrected(tiny_model_run, tmp_path, capsys):
    # a − b alone would be significant (p < 0.05); one of three pairs, it is not.
    a = [0.980, 0.982, 0.978, 0.981]
    b = [0.977, 0.978, 0.975, 0.979]
    c = [0.980, 0.9785, 0.980, 0.9765]
    raw = scipy_stats.ttest_ind(a, b, equal_var=False).pvalue
    assert raw < 0.05
    lines, page = compare(
        tmp_path,
        capsys,
        {"a": (tiny_model_run, a), "b": (tiny_model_run, b), "c": (tiny_model_run, c)},
    )
    assert "Holm-corrected over the 3 tested pairs" in lines[3]
    ab = next(line for line in lines if line.startswith("  a − b"))
    holm = stats.holm(
        [raw] + [scipy_stats.ttest_ind(x, y, equal_var=False).pvalue for x, y in ((a, c), (c, b))]
    )[0]
    assert holm > 0.05
    assert ab.endswith(
        f"p = {stats.format_p(raw)} (Holm-adjusted {stats.format_p(holm)}): "
        "no significant difference at 5%"
    )
    assert "each interval is for its pair alone" in lines[-2]
    assert "Holm-adjusted p" in page


def test_compare_with_one_seed_gives_no_p_value(tiny_model_run, tmp_path, capsys):
    lines, page = compare(
        tmp_path, capsys, {"a": (tiny_model_run, A), "one": (tiny_model_run, [0.97])}
    )
    assert lines[3] == "  a vs one: no test (needs ≥2 seeds per run; one has 1)"
    assert "p =" not in "".join(lines) and "needs ≥2 seeds per run" in page


def test_compare_of_many_runs_tests_each_against_the_best(tiny_model_run, tmp_path, capsys):
    runs = {f"r{i}": (tiny_model_run, [x - 0.001 * i for x in A]) for i in range(7)}
    lines, _ = compare(tmp_path, capsys, runs)
    assert "each run against the best (more than 6 runs)" in lines[7]
    pairs = [line for line in lines if " − " in line]
    assert len(pairs) == 6 and all(line.startswith("  r0 − r") for line in pairs)


# --- the sweep table --------------------------------------------------------------------


def synthetic_sweep(points: list[list[float]], **extra_per_seed) -> dict:
    """A sweep result over `optimizer.lr` with the given per-seed accuracies, best first."""
    results = []
    for i, acc in enumerate(points):
        x = {
            "point": i,
            "rank": i + 1,
            "values": {"optimizer.lr": 0.1 * (i + 1)},
            "label": f"optimizer.lr={0.1 * (i + 1):g}",
            **stats.spread(acc).to_json("test_accuracy"),
            "test_accuracy_per_seed": acc,
            "diverged_seeds": [],
            "epochs_to_target": None,
            "time_to_target_seconds": None,
        }
        for k, v in extra_per_seed.items():
            x.update(stats.spread(v[i]).to_json(k), **{f"{k}_per_seed": v[i]})
        results.append(x)
    return {
        "axes": {"optimizer.lr": [x["values"]["optimizer.lr"] for x in results]},
        "target_accuracy": None,
        "seeds_per_point": len(points[0]),
        "num_points": len(points),
        "num_programs": 1,
        "wall_seconds": 1.0,
        "results": results,
    }


BEST = [0.980, 0.981, 0.979, 0.980]
NEAR = [0.9795, 0.981, 0.978, 0.980]
WORSE = [0.950, 0.951, 0.949, 0.950]


def column(table: str, name: str) -> list[str]:
    """A column of `format_table`'s text by its header, one cell per point."""
    lines = table.splitlines()
    start = lines[0].index(name)
    return [line[start:].split("  ")[0].strip() for line in lines[1:-3]]


def test_sweep_table_marks_points_not_significantly_worse_than_the_best():
    result = synthetic_sweep([BEST, NEAR, WORSE])
    assert stats.near_best([BEST, NEAR, WORSE]) == ["best", "yes", "no"]
    table = sweep.format_table(result)
    assert column(table, "≈ best") == ["best", "yes", "no"]
    assert table.splitlines()[-3] == (
        "≈ best: yes = not significantly worse than the best point and within 0.5 pp of it "
        "(95% interval), no = significantly worse (Welch's t-test on the seeds, two-sided, 5%, "
        "Holm-corrected over the 2 comparisons)"
    )
    # A point with a diverged (NaN) seed has no test, and the legend says what "—" means.
    marks = stats.near_best([BEST, NEAR, [0.9, math.nan]])
    assert marks == ["best", "yes", "—"]
    assert stats.near_best_legend(marks).endswith(
        "5%); — = no test (needs ≥2 seeds per point, every value finite)"
    )
    page = sweep_report.results_table(result)
    assert '<th scope="col">≈ best</th>' in page and page.count('class="hl"') == 2
    assert "Holm-corrected over the 2 comparisons" in page


def test_a_point_far_below_the_best_on_two_seeds_is_never_about_as_good():
    """64% with seeds far apart against 86.5% on two seeds each: Welch's test has too
    little power to call it worse, and it is not "yes" either."""
    best, far = [0.8627, 0.8673], [0.50, 0.78]
    assert not stats.comparisons([best, far], [(0, 1)])[0].significant
    marks = stats.near_best([best, far])
    assert marks == ["best", "can't tell"]
    assert "can't tell = not significantly worse, but its seeds leave room for more than " in (
        stats.near_best_legend(marks)
    )


def test_sweep_marking_is_holm_corrected_and_follows_the_ranked_metric():
    # Each of two points alone is significantly worse (p < 0.05), but not after Holm.
    best = [0.980, 0.982, 0.978, 0.981]
    x, y = [0.977, 0.978, 0.975, 0.979], [0.9765, 0.978, 0.9745, 0.979]
    raw = [scipy_stats.ttest_ind(best, v, equal_var=False).pvalue for v in (x, y)]
    assert max(raw) < 0.05 and min(stats.holm(raw)) > 0.05
    # Not significantly worse after Holm, but 0.3 pp below with room for more than 0.5 pp.
    assert stats.near_best([best, x, y]) == ["best", "can't tell", "can't tell"]
    assert stats.near_best([best, x]) == ["best", "no"]  # alone, one comparison: worse
    # Marked by the metric the table ranks by, given as a parameter: here the last point
    # is best by validation accuracy, and the first is far below it.
    result = synthetic_sweep([BEST, NEAR, WORSE], val_accuracy=[WORSE, NEAR, BEST])
    assert column(sweep.format_table(result, metric="val_accuracy"), "≈ best") == [
        "no",
        "yes",
        "best",
    ]
    page = sweep_report.results_table(result, metric="val_accuracy")
    assert re.findall(r"<td[^>]*>(best|yes|no)</td>", page) == ["no", "yes", "best"]


def test_one_seed_sweep_is_not_marked():
    result = synthetic_sweep([[0.98], [0.97]])
    table = sweep.format_table(result)
    assert "≈ best" not in table.splitlines()[0]
    assert table.splitlines()[-3] == "≈ best: not marked (needs ≥2 seeds per point: --seeds N)"
    assert "not marked" in sweep_report.results_table(result)


def test_compare_refuses_runs_on_different_datasets_in_one_line(tiny_model_run, tmp_path, capsys):
    a = fake_run(tiny_model_run, tmp_path / "a", A)
    f = fake_run(tiny_model_run, tmp_path / "f", B)
    summary = json.loads((f / "summary.json").read_text())
    summary["dataset"] = "fashion_mnist"
    (f / "summary.json").write_text(json.dumps(summary))
    out = tmp_path / "comparison.html"
    assert main(["compare", str(a), str(f), "--out", str(out)]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert len(err.splitlines()) == 1 and "cannot be compared" in err
    assert f"{f} on fashion_mnist" in err and f"{a} on tiny" in err
    assert "significantly" not in captured.out and not out.exists()


def test_compare_help_names_its_significance_test(capsys):
    with pytest.raises(SystemExit):
        main(["compare", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "Welch's t-test on the per-seed accuracies" in text and "Holm-corrected" in text


def test_holms_family_counts_only_the_pairs_that_could_be_tested():
    """Three runs, one of a single seed: of the three pairs only one has a test, so
    Holm's family is 1 and its p is the raw p (counting the untested two tripled it)."""
    found = stats.comparisons([A, B, [0.97]], [(0, 1), (0, 2), (1, 2)])
    tested = [c for c in found if c.test is not None]
    assert len(tested) == 1 and all(c.family == 1 for c in found)
    assert tested[0].p_holm == pytest.approx(tested[0].test.p)
    assert [c.reason is not None for c in found] == [False, True, True]
