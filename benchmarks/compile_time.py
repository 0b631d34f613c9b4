"""How long a run's programs take to compile when nothing is cached: a user's first run.

Runs `jaxmnist train --preset P` for each preset as fresh processes with every
compilation cache off (`--no-compile-cache`, and JAX's own cache variables removed from
the environment), for one step, without report or checkpoints, and reads
`compile_seconds` from the run's summary.json (every program of the run: parameter
initialisation, the epoch's plan, the training steps, evaluation). Also the whole
process's wall time from start to exit, and each program's own compile seconds
(`compile_programs`: they compile concurrently, so they overlap; the slowest is the
run's wall). A preset may carry overrides, `PRESET:KEY=VALUE:...` (e.g.
`speedrun:train.seeds=8`, `record:data.augment=false`). `--pythonpath DIR` runs another
copy of the code (e.g. `git archive OLD jaxmnist` unpacked in DIR) side by side, the
copies taking turns in each round, so that a load that comes and goes falls on both alike.

Needs MNIST and Fashion-MNIST where JAXMNIST_DATA_DIR says; `--smoke` runs `tpu101` (two
seeds) on a tiny generated dataset instead. Writes JSON (`--out`, default
benchmarks/results/compile_time/).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from benchlib.launch import (
    add_code_copies,
    code_copies,
    code_env,
    jaxmnist_command,
    require_data_dir,
)
from benchlib.results import SMOKE_HELP, default_out, save_benchmark

PRESETS = "tpu101,codelab,cnn,speedrun,record"
CACHE_VARIABLES = ("JAX_COMPILATION_CACHE_DIR", "JAX_ENABLE_COMPILATION_CACHE")


def one_run(cmd: list[str], env: dict, run_dir: Path, cwd: str) -> dict:
    """Runs `cmd` to the end; its summary's compile seconds (all programs, and each
    program's), and the process's wall time."""
    start = time.perf_counter()
    done = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed: {done.stderr.strip()[-800:]}")
    summary = json.loads((run_dir / "summary.json").read_text())
    return {
        "compile_seconds": summary["compile_seconds"],
        "wall_seconds": wall,
        "programs": summary.get("compile_programs", {}),
    }


def _median(runs: list[dict]) -> dict:
    """The median of each of `one_run`'s figures over `runs`, each program's too."""
    programs = {n: statistics.median(r["programs"][n] for r in runs) for n in runs[0]["programs"]}
    figures = ("compile_seconds", "wall_seconds")
    return {k: statistics.median(r[k] for r in runs) for k in figures} | {"programs": programs}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--presets",
        default=PRESETS,
        help=f"comma-separated PRESET[:KEY=VALUE...] (default {PRESETS})",
    )
    p.add_argument("--rounds", type=int, default=3, help="runs of each preset per copy")
    add_code_copies(p, "run")
    p.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    p.add_argument("--out", type=Path, help="default benchmarks/results/compile_time/")
    args = p.parse_args(argv)
    out = args.out or default_out("compile_time.json", args.smoke)
    require_data_dir(args.smoke)
    presets = ["tpu101:train.seeds=2"] if args.smoke else args.presets.split(",")
    rounds = 1 if args.smoke else args.rounds
    load_before = os.getloadavg()
    codes = code_copies(args)
    env = {k: v for k, v in os.environ.items() if k not in CACHE_VARIABLES}
    runs: dict = {code: {preset: [] for preset in presets} for code in codes}
    with tempfile.TemporaryDirectory(prefix="compile-time-") as work:
        prefix, tiny = jaxmnist_command(args.smoke, Path(work))
        tiny += ["train.batch_size=2"] if args.smoke else []
        for i in range(rounds):
            order = list(codes.items()) if i % 2 == 0 else list(codes.items())[::-1]
            for preset in presets:
                for code, path in order:
                    run_dir = Path(work) / f"run{i}-{preset}-{len(runs[code][preset])}-{code[:4]}"
                    name, *overrides = preset.split(":")
                    cmd = [*prefix, "train", "--preset", name, *overrides, *tiny, "--quiet"]
                    cmd += ["--run-dir", str(run_dir), "--no-compile-cache", "--no-report"]
                    cmd += ["--no-checkpoint", "train.steps=1", "train.target_accuracy=none"]
                    got = one_run(cmd, code_env(path, env), run_dir, work)
                    runs[code][preset].append(got)
    median = {
        code: {preset: _median(rs) for preset, rs in by_preset.items()}
        for code, by_preset in runs.items()
    }
    for preset in presets:
        cells = [
            f"{code}: compile {median[code][preset]['compile_seconds']:.2f} s, "
            f"process {median[code][preset]['wall_seconds']:.2f} s"
            for code in codes
        ]
        print(f"{preset:<8} " + " | ".join(cells))
    figures = {
        "what": "jaxmnist train --preset P for one step in fresh processes, every compilation "
        "cache off: summary.json's compile_seconds and the process's wall seconds",
        "rounds": rounds,
        "codes": codes,
        "runs": runs,
        "median": median,
    }
    print(save_benchmark(out, figures, load_before))


if __name__ == "__main__":
    main()
