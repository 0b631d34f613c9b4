"""A preset's training epoch, this checkout against other copies of the code, side by side.

Runs `jaxmnist train --preset P --epochs E --no-report --no-checkpoint` (evaluation of
the training set off, so that an epoch's record times its steps alone) in fresh
processes, one per copy of the code in turn (this checkout, then every `--pythonpath
DIR`, e.g. `git archive OLD jaxmnist` unpacked in DIR), `--rounds` times, so that a load
that comes and goes falls on every copy alike. Each run's `metrics.jsonl` gives its
epochs' training seconds (`epoch_seconds`, evaluation excluded); the first epoch of a run
is a warm-up and is dropped. Prints each copy's median steady epoch and its ratio to this
checkout's, per preset.

Needs MNIST (and Fashion-MNIST for its presets) where JAXMNIST_DATA_DIR says; `--smoke`
trains a few steps on a tiny generated dataset instead. Writes JSON (`--out`, default
benchmarks/results/epoch_versions/).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
from pathlib import Path

from benchlib.launch import add_code_copies, code_copies, jaxmnist_command, require_data_dir
from benchlib.results import SMOKE_HELP, default_out, save_benchmark


def epoch_seconds(cmd: list[str], env: dict, cwd: str, run_dir: Path) -> list[float]:
    """Runs `cmd` (a `train` into `run_dir`) to the end; its epochs' training seconds.
    `python -m` puts the working directory first on sys.path: `cwd`, outside any copy of
    the code, keeps PYTHONPATH's copy the one that runs."""
    done = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed: {done.stderr[-800:]}")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["epoch_seconds"] for r in records if "epoch_seconds" in r]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--presets", default="cnn", help="comma-separated (default cnn)")
    p.add_argument("--epochs", type=int, default=3, help="per run, the first dropped (default 3)")
    p.add_argument("--rounds", type=int, default=5, help="runs of each copy (default 5)")
    add_code_copies(p, "train")
    p.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    p.add_argument("--out", type=Path, help="default benchmarks/results/epoch_versions/")
    args = p.parse_args(argv)
    if args.epochs < 2:
        p.error("--epochs must be at least 2: the first epoch of a run is dropped")
    out = args.out or default_out("epoch_versions.json", args.smoke)
    require_data_dir(args.smoke)
    load_before = os.getloadavg()
    codes = code_copies(args)
    presets = [name for name in args.presets.split(",") if name]
    rounds = 1 if args.smoke else args.rounds
    runs: dict = {preset: {code: [] for code in codes} for preset in presets}
    with tempfile.TemporaryDirectory(prefix="epoch-versions-") as work:
        prefix, tiny = jaxmnist_command(args.smoke, Path(work))
        for preset in presets:
            base = ["train", "--preset", preset, "--epochs", str(args.epochs), "--quiet"]
            base += ["--no-report", "--no-checkpoint", "train.eval_train=false", *tiny]
            if args.smoke:
                base += ["train.batch_size=2", "model.channels=4,8", "model.hidden=16"]
            for _ in range(rounds):
                for code, path in codes.items():
                    run_dir = Path(work) / f"run{len(list(Path(work).glob('run*')))}"
                    cmd = [*prefix, *base, "--run-dir", str(run_dir)]
                    env = {**os.environ, "PYTHONPATH": path}
                    runs[preset][code].append(epoch_seconds(cmd, env, work, run_dir))
    figures: dict = {
        "what": "steady training epochs (the first of each run dropped), in seconds, of "
        "each copy of the code, the runs taking turns",
        "epochs": args.epochs,
        "rounds": rounds,
        "codes": codes,
        "runs": runs,
        "median": {},
        "ratio_to_this": {},
    }
    for preset, by_code in runs.items():
        medians = {
            code: statistics.median(s for run in code_runs for s in run[1:])
            for code, code_runs in by_code.items()
        }
        figures["median"][preset] = medians
        figures["ratio_to_this"][preset] = {c: m / medians["this"] for c, m in medians.items()}
        for code, m in medians.items():
            steady = [round(s, 2) for run in by_code[code] for s in run[1:]]
            print(
                f"{preset} {code}: median steady epoch {m:.3f} s "
                f"({m / medians['this']:.3f}x this checkout's); epochs {steady}"
            )
    print(save_benchmark(out, figures, load_before))


if __name__ == "__main__":
    main()
