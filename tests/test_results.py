"""Benchmark results are records with their provenance (benchmarks/benchlib/results.py).

Each new result is a file of its own, `benchmarks/results/<benchmark>/<date>_<commit>_
<machine>.json`, never one that exists, and holds the commit it measured (and whether the
checkout differed from it), the date, the exact command and the machine beside its
figures.
"""

import datetime
import importlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.fixture
def results(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    return importlib.import_module("benchlib.results")


def git(*args) -> str:
    return subprocess.run(
        ["git", *args], cwd=BENCHMARKS, capture_output=True, text=True, check=True
    ).stdout.strip()


def test_a_result_records_its_commit_date_command_and_machine(results, tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["benchmarks/x.py", "--rounds", "3"])
    before = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
    line = results.save_benchmark(tmp_path / "x.json", {"figure": 1.5}, (0.5, 0.5, 0.5))
    assert line.endswith(str(tmp_path / "x.json"))
    record = json.loads((tmp_path / "x.json").read_text())
    prov = record["provenance"]
    assert record["figure"] == 1.5
    assert prov["commit"] == git("rev-parse", "HEAD")
    dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    assert prov["dirty"] is dirty
    assert (
        before
        <= datetime.datetime.fromisoformat(prov["date"])
        <= before + datetime.timedelta(minutes=5)
    )
    assert prov["command"].endswith("benchmarks/x.py --rounds 3")
    machine = prov["machine"]
    assert machine["cpu_count"] >= 1 and machine["accelerator"] is None  # tests run on a CPU
    assert isinstance(machine["cpu_flags"], list) and "cpu_model" in machine
    assert set(record) >= {"load_average", "environment"}


def test_a_new_record_never_replaces_one(results, tmp_path, monkeypatch):
    monkeypatch.setattr(results, "RESULTS", tmp_path)
    first = results.default_out("bench_x.json")
    assert first.parent == tmp_path / "bench_x"
    commit = git("rev-parse", "--short=7", "HEAD")
    assert re.fullmatch(rf"\d{{4}}-\d\d-\d\d_{commit}(-dirty)?_[a-z0-9-]+\.json", first.name)
    results.save_benchmark(first, {"figure": 1}, (0.0,) * 3)
    second = results.default_out("bench_x.json")
    assert second != first and second.parent == first.parent
    results.save_benchmark(second, {"figure": 2}, (0.0,) * 3)
    assert json.loads(first.read_text())["figure"] == 1
    assert len(list(first.parent.iterdir())) == 2


def test_outside_a_checkout_the_commit_is_none(results, tmp_path, monkeypatch):
    monkeypatch.setattr(results, "CHECKOUT", tmp_path)  # no git repository
    prov = results.provenance()
    assert prov["commit"] is None and prov["dirty"] is False
    assert "_nocommit_" in results.record_name(prov)


@pytest.fixture
def goals(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    return importlib.import_module("goals")


def test_the_readme_goals_table_is_read_from_the_newest_records(goals, capsys):
    # README.md holds benchmarks/goals.py's table as it reads the records now: a figure
    # edited by hand, or a newer record not yet in the README, fails here.
    assert goals.main(["--check"]) == 0, capsys.readouterr().out
    table = goals.table()
    assert len(goals.GOALS) <= 12 and table.count("\n") == len(goals.GOALS) + 2
    for goal in goals.GOALS:
        path, _, commit, date = goals.newest(goal)
        assert path.is_file() and re.fullmatch(r"[0-9a-f]{7}(-dirty)?", commit), goal.goal
        assert re.fullmatch(r"\d{4}-\d\d-\d\d", date), goal.goal


def test_a_newer_record_replaces_the_figure(goals, results, tmp_path, monkeypatch):
    goal = next(g for g in goals.GOALS if g.benchmark == "startup")
    folder = tmp_path / "startup"
    folder.mkdir()
    monkeypatch.setattr(goals, "RESULTS", tmp_path)
    legacy = json.loads((BENCHMARKS / "results" / goal.legacy).read_text())
    (tmp_path / goal.legacy).write_text(json.dumps(legacy))
    monkeypatch.setattr(results, "RESULTS", tmp_path)
    newer = results.default_out("startup.json")
    results.save_benchmark(newer, {**legacy, "slowest_median_seconds": 0.0421}, (0.0,) * 3)
    path, record, commit, date = goals.newest(goal)
    assert date == record["provenance"]["date"][:10]
    assert path == newer and goal.figure(record) == ("0.042 s", True)
    assert (
        commit == git("rev-parse", "--short=7", "HEAD") + "-dirty" * record["provenance"]["dirty"]
    )


def _startup_record(seconds: float, commit: str, date: str) -> dict:
    prov = {"commit": commit, "dirty": False, "date": date, "machine": {"cpu_model": "X"}}
    return {"slowest_median_seconds": seconds, "within_goal": seconds <= 0.3, "provenance": prov}


def test_a_goal_missed_in_one_run_of_its_commit_is_not_shown_as_met(goals, tmp_path, monkeypatch):
    goal = next(g for g in goals.GOALS if g.benchmark == "startup")
    folder = tmp_path / "benchmarks" / "results" / "startup"
    folder.mkdir(parents=True)
    monkeypatch.setattr(goals, "ROOT", tmp_path)
    monkeypatch.setattr(goals, "RESULTS", tmp_path / "benchmarks" / "results")
    runs = {  # name -> (seconds, commit, date): an older commit's miss, then two runs of one
        "older": (0.9, "1" * 40, "2026-01-01T00:00:00+00:00"),
        "first": (0.35, "2" * 40, "2026-01-02T00:00:00+00:00"),
        "second": (0.12, "2" * 40, "2026-01-03T00:00:00+00:00"),
    }
    for name, run in runs.items():
        (folder / f"{name}.json").write_text(json.dumps(_startup_record(*run)))
    assert [p.stem for p, _ in goals.same_commit(goal)] == ["first", "second"]
    row = goals.goal_row(goal)
    assert "| 0.120 s; an earlier run at this commit: 0.350 s |" in row
    assert "| **missed** in 1 of 2 runs at this commit |" in row
    (folder / "first.json").write_text(json.dumps(_startup_record(0.2, *runs["first"][1:])))
    assert "| met |" in goals.goal_row(goal)  # every run of the commit met it
    for name in ("first", "second"):  # and none
        (folder / f"{name}.json").write_text(json.dumps(_startup_record(0.5, *runs[name][1:])))
    assert "| **missed** |" in goals.goal_row(goal)


def test_the_tpu_page_gives_every_run_of_the_newest_records_commit(goals, tmp_path, monkeypatch):
    goal = next(g for g in goals.GOALS if g.benchmark == "tpu/time_to_result")
    _, record, _, _ = goals.newest(goal)
    folder = tmp_path / "benchmarks" / "results" / "tpu" / "time_to_result"
    folder.mkdir(parents=True)
    monkeypatch.setattr(goals, "ROOT", tmp_path)
    monkeypatch.setattr(goals, "RESULTS", tmp_path / "benchmarks" / "results")
    prov = {**record["provenance"], "commit": "3" * 40, "dirty": False}
    earlier = json.loads(json.dumps(record))  # a copy, measured first and slower
    earlier["provenance"] = {**prov, "date": "2026-01-01T00:00:00+00:00"}
    earlier["compile"]["codelab"]["compile_seconds"] = 3.21
    earlier["cold_ratio"] = 0.51
    (folder / "a.json").write_text(json.dumps(earlier))
    (folder / "b.json").write_text(
        json.dumps({**record, "provenance": {**prov, "date": "2026-02-01"}})
    )
    table = goals.time_to_result_table()
    codelab = next(line for line in table.splitlines() if line.startswith("| `codelab` |"))
    assert codelab.startswith(f"| `codelab` | {goals.compile_cell(record['compile']['codelab'])} |")
    assert codelab.endswith("| 3.21 s |")
    assert table.splitlines()[2].endswith(f"| {record['cold_ratio']:.2f}× | ≤ 0.6× | 0.51× |")
    assert "b.json" in table.splitlines()[-1] and "earlier: [tpu/time_to_result/a.json]" in table


def test_a_variant_of_a_record_preset_is_not_the_presets_figure(goals):
    measures = goals._whole_run_of("record")
    epochs = goals.config_lib.get_preset("record").train.epochs
    as_is = {"command": "jaxmnist train --preset record --quiet", "overrides": []}
    assert measures({"presets": {"record": as_is}})
    # overrides that give the preset's own values (a run the preset was later set to)
    same = {"command": f"jaxmnist train --preset record --quiet train.epochs={epochs}"}
    assert measures({"presets": {"record": same}})
    smoothed = {**as_is, "overrides": ["train.label_smoothing=0.1"]}
    assert not measures({"presets": {"record": smoothed}})
    older = {"command": f"jaxmnist train --preset record --quiet train.epochs={epochs + 1}"}
    assert not measures({"presets": {"record": older}})
    assert not measures({"presets": {"record": {**as_is, "partial": True}}})
    assert not measures({"presets": {}})


def test_the_tpu_pages_time_to_result_is_the_newest_full_records(goals):
    table = goals.time_to_result_table()
    goal = next(g for g in goals.GOALS if g.benchmark == "tpu/time_to_result")
    path, record, commit, _ = goals.newest(goal)
    assert set(goals.COMPILE_PRESETS) <= set(record["compile"])
    cold = f"| {record['jaxmnist_cold_seconds']:.2f} s | {record['cold_ratio']:.2f}× |"
    warm = f"| {record['jaxmnist_warm_seconds']:.2f} s | {record['warm_ratio']:.2f}× |"
    assert cold in table.split("\n")[2] and warm in table.split("\n")[3]
    for name, c in record["compile"].items():
        assert f"| `{name}` | {goals.compile_cell(c)} |" in table
    assert path.name in table and commit in table


def test_a_compile_measured_more_than_once_shows_its_median_and_every_run(goals):
    once = {"compile_seconds": 2.84, "compile_samples": [2.84]}
    assert goals.compile_cell(once) == "2.84 s"
    assert goals.compile_cell({"compile_seconds": 3.21}) == "3.21 s"  # records before samples
    thrice = {"compile_seconds": 2.76, "compile_samples": [2.92, 2.45, 2.76]}
    assert goals.compile_cell(thrice) == "2.76 s (median of 3: 2.92, 2.45, 2.76)"


# `<benchmark>/<date>_<commit>[-dirty]_<machine>[_<what>][~n].<ext>`: a benchmark's folder
# (`tpu/time_to_result` has two levels), then what benchlib.results names a record by.
RECORD_PATH = re.compile(
    r"(?P<benchmark>[a-z0-9_]+(?:/[a-z0-9_]+)?)/(?P<date>\d{4}-\d\d-\d\d)_"
    r"(?P<commit>[0-9a-f]{7})(?:-dirty)?_[a-z0-9-]+(?:_[a-z0-9_]+)?(?:~\d+)?\.(?:json|html|png|txt|xml)"
)


def test_every_result_file_is_a_record_named_for_its_date_commit_and_machine():
    root = BENCHMARKS / "results"
    files = [p for p in sorted(root.rglob("*")) if p.is_file()]
    assert len(files) > 100  # the glob found the records
    names = {p: RECORD_PATH.fullmatch(p.relative_to(root).as_posix()) for p in files}
    strays = [str(p.relative_to(root)) for p, m in names.items() if m is None]
    assert not strays, f"not named <benchmark>/<date>_<commit>_<machine>[_<what>]: {strays}"
    for path, m in names.items():
        record = json.loads(path.read_text()) if path.suffix == ".json" else {}
        prov = record.get("provenance") or {}
        if prov.get("commit"):  # a record that keeps its provenance is named by it
            assert (prov["commit"][:7], prov["date"][:10]) == (m["commit"], m["date"]), path
    if git("rev-parse", "--is-shallow-repository") == "true":
        return  # a shallow clone lacks the older commits the records name
    commits = sorted({m["commit"] for m in names.values()})
    known = subprocess.run(
        ["git", "cat-file", "--batch-check"],
        input="".join(f"{c}^{{commit}}\n" for c in commits),
        cwd=BENCHMARKS, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    unknown = [c for c, line in zip(commits, known.splitlines(), strict=True) if "missing" in line]
    assert not unknown, f"records named for commits the history lacks: {unknown}"
