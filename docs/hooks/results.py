"""The Results page's records, written from benchmarks/results/ each time the docs are built.

Each folder of benchmarks/results/ that holds files is a benchmark's; a record is a file,
or the files of one name (bench's json, png and html), named
`<date>_<commit>_<machine>[_<what>]` as `benchlib.results` names them. For each benchmark
the newest record on a CPU, and the newest on an accelerator, give its figures
(`headlines.BENCHMARKS` reads them from the record), with the machine, the date, the
commit and the record beside them; the older records are listed under it. Newest means
measured last: the date and time a record keeps in its provenance, else the time of the
commit its name gives; of records of one time, the one without `_<what>` is the newer,
then the later name. `page()` returns the Markdown; a benchmark without an entry in
`headlines`, in no group, or whose newest record its reader cannot read is a warning,
which fails the strict build.
"""

from __future__ import annotations

import datetime
import functools
import json
import logging
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # MkDocs loads hooks as files, not a package
import headlines
from reference import load_goals

log = logging.getLogger("mkdocs.hooks.results")
ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
NAME = re.compile(
    r"(?P<date>\d{4}-\d\d-\d\d)_(?P<commit>[0-9a-f]{7}(?:-dirty)?)_(?P<machine>[a-z0-9-]+)"
    r"(?:_(?P<what>[a-z0-9_]+))?(?:~\d+)?"
)

# The page's groups: a title, a sentence, the benchmarks' folders. The accelerator's group
# takes the newest accelerator record of every folder that has one.
ACCELERATOR = "On an accelerator"
GROUPS = (
    (ACCELERATOR, "Each benchmark's newest record on an accelerator (a TPU v5e chip so far)."),
    (
        "Training and accuracy",
        "What the presets reach, as means over seeds, and the trials that chose their recipes.",
        "cnn_presets",
        "record",
        "seeds_vs_single",
    ),
    (
        "Speed of a training step and an epoch",
        (
            "The compiled epoch against other ways of training the same model, the convolution's "
            "and the augmentation's formulations, where a step's time goes."
        ),
        "cnn_vs_pytorch",
        "epoch_vs_tutorial",
        "bench_tpu101",
        "bf16_matmul",
        "first_conv",
        "batch_norm_cost",
        "augment_gathers",
        "profile_record",
        "devices_scaling",
        "run_layer_before_after",
    ),
    (
        "Compile and start-up",
        "What a user waits for before the first step.",
        "compile_time",
        "aot_compile",
        "staged_batches",
        "startup",
        "data_loading",
    ),
    (
        "Memory",
        "The estimate that sizes populations, and the host allocator's settings.",
        "memory_estimate",
        "host_memory",
    ),
    (
        "Around training",
        "The report, evaluation, checkpoints, stopping and serving.",
        "run_overhead",
        "eval_overhead",
        "checkpoint_overhead",
        "stop_latency",
        "serve_load",
    ),
    (
        "Choices made",
        (
            "The measurements behind choices made, kept or tried and left; their scripts have "
            "left `benchmarks/`."
        ),
        "conv_backward",
        "onednn_pool",
        "epoch_versions",
        "first_block",
        "pacing_overhead",
        "search_pruning",
        "shuffle",
    ),
)


@dataclass(frozen=True, eq=False)  # records compare as themselves: their JSON is a dict
class Record:
    folder: str  # the benchmark's, from benchmarks/results/ (`tpu/time_to_result`)
    stem: str  # <date>_<commit>_<machine>[_<what>]
    what: str  # its <what>, "" for none
    files: tuple[Path, ...]  # its files, the JSON first
    data: dict | None  # the JSON, where it has one
    date: str
    commit: str
    machine: str  # as the record says it, else as its name does
    accelerator: bool
    when: tuple  # the order of measurement


_goals = functools.cache(load_goals)  # benchmarks/goals.py: how records are dated and placed


@functools.cache
def _commit_time(commit: str) -> str:
    done = subprocess.run(
        ["git", "show", "-s", "--format=%cI", commit.removesuffix("-dirty")],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    return done.stdout.strip() or "1970-01-01T00:00:00+00:00"  # a commit this clone lacks


def _record(folder: str, stem: str, files: list[Path]) -> Record | None:
    name = NAME.fullmatch(stem)
    if name is None:
        log.warning("benchmarks/results/%s/%s is not named as a record is", folder, stem)
        return None
    files = sorted(files, key=lambda p: p.suffix != ".json")
    data = json.loads(files[0].read_text()) if files[0].suffix == ".json" else None
    goals = _goals()
    if data is not None:
        commit, date = goals.provenance_of(files[0], data)
        machine = goals._machine(data)
    else:
        commit, date, machine = name["commit"], name["date"], "?"
    prov = (data or {}).get("provenance") or {}
    env = (data or {}).get("environment") or {}
    accelerator = bool(
        (prov.get("machine") or {}).get("accelerator")
        or env.get("backend") not in (None, "cpu")
        or (data or {}).get("backend") not in (None, "cpu")
        or name["machine"].startswith("tpu-")
    )
    if machine.startswith("?") and (data or {}).get("cpu_model"):  # kept at its top level
        machine = f"{data.get('cpu_count', '?')}-core {data['cpu_model']}"
    elif machine.startswith("?"):
        machine = f"`{name['machine']}`"  # no machine recorded: the one its name gives
    when = datetime.datetime.fromisoformat(prov.get("date") or _commit_time(commit))
    when = when.astimezone(datetime.UTC).isoformat()  # comparable whatever its offset
    return Record(
        folder, stem, name["what"] or "", tuple(files), data, date, commit, machine, accelerator,
        (when, name["what"] is None, stem),
    )  # fmt: skip


def collect() -> dict[str, list[Record]]:
    """Every benchmark folder's records, newest last."""
    out: dict[str, list[Record]] = {}
    for folder in sorted({p.parent for p in RESULTS.rglob("*") if p.is_file()}):
        key = folder.relative_to(RESULTS).as_posix()
        stems: dict[str, list[Path]] = {}
        for path in folder.iterdir():
            if path.is_file():
                stems.setdefault(path.name.split(".")[0], []).append(path)
        found = [_record(key, stem, files) for stem, files in stems.items()]
        out[key] = sorted((r for r in found if r), key=lambda r: r.when)
    return out


def newest(records: list[Record], accelerator: bool) -> Record | None:
    return next((r for r in reversed(records) if r.accelerator == accelerator), None)


def anchor(folder: str, accelerator: bool = False) -> str:
    """The id of a benchmark's section: `cnn_presets`, `cnn_presets-accelerator`."""
    return folder.replace("/", "-") + ("-accelerator" if accelerator else "")


def _link(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _files(record: Record) -> str:
    return ", ".join(f"[{p.suffix[1:]}]({_link(p)})" for p in record.files)


def _source(folder: str, bench: headlines.Benchmark) -> str:
    if bench.source:
        return bench.source
    script = ROOT / "benchmarks" / f"{folder}.py"
    if not script.exists():
        log.warning(
            "benchmarks/results/%s: no script benchmarks/%s.py, and no source", folder, folder
        )
        return "?"
    return f"`python benchmarks/{folder}.py` ([script]({_link(script)}))"


def _figures(record: Record, bench: headlines.Benchmark) -> list[str]:
    where = f"{record.machine}, {record.date}, commit `{record.commit}` ({_files(record)})"
    if bench.figures is None:
        return [f"Newest: {where}.", ""]
    try:
        rows = bench.figures(record.data)
    except (KeyError, TypeError, IndexError) as e:
        log.warning("%s: its reader cannot read %s (%r)", record.folder, record.stem, e)
        return [f"Newest: {where}; its figures could not be read.", ""]
    out = [f"Newest: {where}.", "", "| what | figure |", "| --- | --- |"]
    return out + [f"| {what} | {figure} |" for what, figure in rows] + [""]


def _older(records: list[Record], shown: set[Record]) -> list[str]:
    older = [r for r in reversed(records) if r not in shown]
    if not older:
        return []
    items = [
        f"{r.date}, {r.machine}{f', `{r.what}`' if r.what else ''}: {_files(r)}" for r in older
    ]
    return ["Older records, newest first:", "", *(f"- {item}" for item in items), ""]


def _section(folder: str, records: list[Record], accelerator: bool, home: bool) -> list[str]:
    bench = headlines.BENCHMARKS.get(folder)
    if bench is None:
        log.warning("benchmarks/results/%s: no entry in docs/hooks/headlines.py", folder)
        bench = headlines.Benchmark("?", None, "?")
    record = newest(records, accelerator)
    title = f"`{folder}`" + (f" on {record.machine}" if accelerator else "")
    title += f" {{#{anchor(folder, accelerator)}}}"
    what = f"{bench.what} Measured by {_source(folder, bench)}."
    out = [f"### {title}", "", what, "", *_figures(record, bench)]
    if home:  # the older records, under the section of the folder's own group
        out += _older(records, {newest(records, False), newest(records, True)} - {None})
    return out


def page() -> str:
    """The Markdown of every benchmark's records, by group."""
    every = collect()
    grouped = {f for _, _, *folders in GROUPS for f in folders}
    out = []
    for title, sentence, *folders in GROUPS:
        if title == ACCELERATOR:
            chosen = [f for f, rs in every.items() if newest(rs, True)]
            chosen.sort(key=lambda f: (f in grouped, f))
        else:
            chosen = [f for f in folders if f in every and newest(every[f], False)]
        out += [f"## {title}", "", sentence, ""]
        for folder in chosen:
            only_here = title == ACCELERATOR and not newest(every[folder], False)
            out += _section(
                folder, every[folder], title == ACCELERATOR, title != ACCELERATOR or only_here
            )
    loose = [f for f, rs in every.items() if f not in grouped and newest(rs, False)]
    for folder in loose:
        log.warning("benchmarks/results/%s: in no group of docs/hooks/results.py", folder)
    if loose:
        out += ["## Not grouped", ""]
        for folder in loose:
            out += _section(folder, every[folder], False, True)
    return "\n".join(out) + "\n"
