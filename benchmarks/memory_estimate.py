"""The memory estimate that plans a population's chunks, against the memory it really used.

For each case (a preset, with and without batch norm where the model has it, 1 and 8
seeds) a fresh process trains a few steps through `train_population` and an evaluation
(the run's largest working memory is often the evaluation batch's). The estimate is
`jaxmnist.training.memory`'s figure for the chunk it planned: the data, states, plans
and the largest program's working memory, read from the compiled programs before
anything is placed. The measured figure is what the process added from just after that
estimate (the programs compiled, nothing placed yet) to its peak: on an accelerator
`memory_stats()`'s peak bytes in use plus its peak bytes reserved (a TPU holds programs'
working memory there, apart from the arrays in use: `memory.device_peak_bytes`), on CPU
the peak resident set (VmHWM, reset there through /proc/self/clear_refs) minus the
resident set then, after `malloc_trim` has handed the compiler's freed memory back (else
the run would reuse it unseen). So both are of the same thing: what the data, the
models and the running programs hold. The goal: every estimate within +30% / -10% of the
measured peak (below it is an out-of-memory crash, above it only smaller chunks). On
CPU the peak of one case can move from run to run (the order of the allocator's requests
differs; `hostmem.hand_back` between a run's programs keeps most of that out), so each
case runs `--repeats` times, each in a fresh process, and its measured figure is the
largest: the one a plan must cover. Every repeat's figure is kept in the result.

Needs MNIST where JAXMNIST_DATA_DIR (or the cache) has it, except with --smoke.

`--set KEY=VALUE` (repeatable) changes every case's config, as `jaxmnist train` overrides do:
`--set train.eval_batch_size=2000` makes the evaluation's working memory, not the steps',
the largest of the CNN cases (their presets evaluate in batches of 500). Each case trains
`--steps` steps in the calls the run loop paces (the first of one step), enough calls
for the second block of working memory that some calls of the steps program take.

Usage: JAXMNIST_DATA_DIR=../shared/datasets python benchmarks/memory_estimate.py
    [--steps 20] [--repeats 3] [--presets tpu101,codelab,cnn,speedrun] [--seeds 1,8]
    [--set KEY=VALUE ...] [--smoke]
Prints a table and writes JSON (`--out`, default benchmarks/results/memory_estimate/).
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from benchlib.proc import status_kb
from benchlib.results import SMOKE_HELP, default_out, save_benchmark

HIGH, LOW = 1.30, 0.90  # the goal: estimate / measured within these
WITH_BATCH_NORM = ("cnn", "speedrun")  # the presets whose model has `model.batch_norm`


def reset_peak_rss(clear_refs: Path = Path("/proc/self/clear_refs")) -> None:
    """VmHWM := VmRSS, so that the peak measured is the run's from here on. Exits with one
    line where the kernel does not let the process write `clear_refs` (a sandbox): the
    process's peak would then hold the compiler's, and the figure would be wrong."""
    try:
        clear_refs.write_text("5")
    except OSError as e:
        raise SystemExit(
            f"memory_estimate.py: cannot reset the peak RSS ({clear_refs}: {e.strerror}); "
            "host-memory peaks cannot be measured here"
        ) from None


def _device_stats() -> dict | None:
    import jax

    stats = jax.local_devices()[0].memory_stats()
    return stats if stats and "peak_bytes_in_use" in stats else None


def measure_case(
    preset: str, batch_norm: bool | None, seeds: int, steps: int, smoke: bool, sets=()
):
    """Runs one case in this process (a fresh one: the peak is the process's), with the
    overrides `sets` ("KEY=VALUE" strings) last; returns the estimate and the measured
    peak."""
    from jaxmnist import config as config_lib
    from jaxmnist import hostmem
    from jaxmnist.training import loop, memory
    from jaxmnist.training.population import seed_members

    hostmem.keep_freed_memory()  # as the CLI does
    overrides = {
        "train.seeds": seeds,
        "train.steps": steps,
        "train.target_accuracy": "none",
        "compile_cache": "false",
    }
    if batch_norm is not None:
        overrides["model.batch_norm"] = str(batch_norm).lower()
    if smoke:
        overrides |= {"train.batch_size": 16, "train.eval_batch_size": 32}
    asked = dict(config_lib.parse_override(s) for s in sets)
    cfg = config_lib.apply_overrides(config_lib.get_preset(preset), overrides | asked)
    if smoke:
        from jaxmnist.bench.measure import synthetic_dataset

        dataset = synthetic_dataset(cfg.data.dataset, train_size=64, test_size=32)
    else:
        from jaxmnist.data import load_dataset

        dataset = load_dataset(cfg.data.dataset, cfg.data.data_dir, download=False)
    seen: dict = {}
    planned = memory.chunks_for

    def chunks_for(*args):
        start = time.perf_counter()
        chunks, about = planned(*args)
        seen.update(about, estimate_seconds=time.perf_counter() - start)
        stats = _device_stats()
        # What is placed already (nothing of the run's) is not counted; what is reserved
        # for programs is (a TPU reserves at a program's first run: none yet, and kept in
        # the result to show it).
        seen["device_in_use"] = stats and stats["bytes_in_use"]
        seen["device_reserved"] = stats and stats.get("bytes_reserved", 0)
        if not stats:  # the host's memory is the device's: its peak from here on
            gc.collect()
            ctypes.CDLL("libc.so.6").malloc_trim(0)  # the compiler's freed memory, to the OS
            reset_peak_rss()
            seen["rss_kb"] = status_kb("VmRSS")
        return chunks, about

    memory.chunks_for = chunks_for
    try:
        result = loop.train_population(cfg, seed_members(cfg), dataset)
    finally:
        memory.chunks_for = planned
    stats = _device_stats()
    if stats:
        measured = memory.device_peak_bytes(stats) - seen["device_in_use"]
        how = "peak_bytes_in_use + peak_bytes_reserved"
    else:
        measured, how = (status_kb("VmHWM") - seen["rss_kb"]) * 1024, "peak RSS"
    return {
        "preset": preset,
        "batch_norm": batch_norm,
        "seeds": seeds,
        "chunks": seen["chunks"],
        "estimate_mb": seen["memory_estimate_mb"],
        "measured_mb": round(measured / 2**20, 1),
        "measured_as": how,
        # What the overrides set, as the run's config holds it.
        "set": {k: getattr(getattr(cfg, k.split(".")[0]), k.split(".")[1]) for k in asked},
        "estimate_seconds": round(seen["estimate_seconds"], 2),
        "compile_seconds": round(result.compile_seconds, 2),
        **(
            {"reserved_mb_once_compiled": round(seen["device_reserved"] / 2**20, 1)}
            if stats
            else {}
        ),
    }


def run_case(preset, batch_norm, seeds, steps, smoke, sets=()) -> dict:
    """`measure_case` in a fresh Python process."""
    cmd = [
        sys.executable, __file__, "--one", preset, str(batch_norm), str(seeds),
        "--steps", str(steps), *(["--smoke"] if smoke else []),
        *(a for s in sets for a in ("--set", s)),
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed: {done.stderr[-800:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--presets", default="tpu101,codelab,cnn,speedrun")
    p.add_argument("--seeds", default="1,8", help="population sizes, comma-separated")
    p.add_argument("--steps", type=int, default=20, help="training steps per case")
    p.add_argument("--repeats", type=int, default=3, help="fresh processes per case (max taken)")
    p.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="a config override"
    )
    p.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    p.add_argument("--out", type=Path)
    one = ("PRESET", "BATCH_NORM", "SEEDS")
    p.add_argument("--one", nargs=3, metavar=one, help=argparse.SUPPRESS)  # a case, in this process
    args = p.parse_args(argv)
    from jaxmnist.config import parse_override
    from jaxmnist.errors import ConfigError

    try:
        sets = dict(parse_override(s) for s in args.set)
    except ConfigError as e:
        p.error(str(e))
    if args.one:
        preset, bn, seeds = args.one
        batch_norm = None if bn == "None" else bn == "True"
        case = measure_case(preset, batch_norm, int(seeds), args.steps, args.smoke, args.set)
        print(json.dumps(case))
        return
    presets, counts = args.presets.split(","), [int(s) for s in args.seeds.split(",")]
    batch_norms = (False, True)
    if args.smoke:
        # One case, a population with batch norm, in one fresh process: a case costs a JAX
        # start-up and its compiles.
        presets, counts, args.steps, args.repeats = ["speedrun"], [2], 2, 1
        batch_norms = (True,)
    out = args.out or default_out("memory_estimate.json", args.smoke)
    load_before = os.getloadavg()
    cases = []
    print(f"{'preset':10s} {'bn':>5s} {'seeds':>5s} {'chunks':>8s} {'estimate':>10s} "
          f"{'measured':>10s} {'ratio':>6s}")  # fmt: skip
    for preset in presets:
        for bn in batch_norms if preset in WITH_BATCH_NORM else (None,):
            for seeds in counts:
                runs = [run_case(preset, bn, seeds, args.steps, args.smoke, args.set)
                        for _ in range(args.repeats)]  # fmt: skip
                c = max(runs, key=lambda r: r["measured_mb"])
                c["measured_mb_repeats"] = [r["measured_mb"] for r in runs]
                c["ratio"] = round(c["estimate_mb"] / max(c["measured_mb"], 1e-9), 3)
                c["within_goal"] = LOW <= c["ratio"] <= HIGH
                cases.append(c)
                print(
                    f"{preset:10s} {'-' if bn is None else str(bn).lower():>5s} {seeds:5d} "
                    f"{','.join(map(str, c['chunks'])):>8s} {c['estimate_mb']:8.0f}MB "
                    f"{c['measured_mb']:8.0f}MB {c['ratio']:6.2f}"
                    + ("" if c["within_goal"] else "  outside +30%/-10%")
                )
    ratios = [c["ratio"] for c in cases]
    print(f"ratio estimate/measured: {min(ratios):.2f} .. {max(ratios):.2f}")
    figures = {
        "steps": args.steps,
        "repeats": args.repeats,
        "overrides": sets,
        "goal": {"low": LOW, "high": HIGH},
        "cases": cases,
    }
    print(save_benchmark(out, figures, load_before))


if __name__ == "__main__":
    main()
