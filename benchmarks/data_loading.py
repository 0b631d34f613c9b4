"""What loading a dataset costs: wall time and the host memory it leaves the process holding.

Each repeat loads the dataset (`jaxmnist.data.load_dataset`, verified as a run loads it)
in a fresh Python process with the host allocator set as the CLI sets it
(`hostmem.keep_freed_memory`: freed memory is kept for reuse, so a transient peak stays
in the process for the rest of a run). Per process: the seconds `load_dataset` took and
how much the resident set's peak (VmHWM) grew over it, beside the arrays' own bytes. The
copies of the code take turns, so that a burst of load falls on all of them alike;
`--pythonpath DIR` adds another copy (e.g. `git archive OLD jaxmnist` unpacked in DIR).

Needs the dataset where JAXMNIST_DATA_DIR (or the cache) has it; `--smoke` loads a tiny
generated dataset instead, which each process writes and registers first.

Usage: python benchmarks/data_loading.py [--dataset mnist] [--repeats 4] [--pythonpath DIR]
Prints a line per copy and writes JSON (`--out`, default benchmarks/results/data_loading/).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchlib.launch import add_code_copies, code_copies, code_env, require_data_dir
from benchlib.results import SMOKE_HELP, default_out, save_benchmark

# One load in this process: {seconds, peak growth, array bytes} as JSON on stdout.
ONE_LOAD = """
import json, sys, time
from jaxmnist import hostmem
hostmem.keep_freed_memory()
from jaxmnist.data import load_dataset

def hwm_kb():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))

name, data_dir = sys.argv[1], None
if len(sys.argv) > 2:  # --smoke: a tiny dataset, generated and registered here
    from pathlib import Path
    from jaxmnist.data import registry, synthetic
    arrays = synthetic.tiny_arrays()
    registry.DATASETS[name] = spec = synthetic.tiny_spec(arrays, name=name)
    data_dir = sys.argv[2]
    synthetic.write_idx_folder(Path(data_dir) / spec.folder, arrays, spec)
before = hwm_kb()
start = time.perf_counter()
data = load_dataset(name, data_dir, download=False)
seconds = time.perf_counter() - start
arrays = (data.train_images, data.train_labels, data.test_images, data.test_labels)
print(json.dumps({"seconds": seconds, "peak_growth_mb": (hwm_kb() - before) / 1024,
                  "array_mb": sum(a.nbytes for a in arrays) / 2**20}))
"""


def one_load(path: str, dataset: str, env: dict, tiny_dir: str | None = None) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", ONE_LOAD, dataset, *([tiny_dir] if tiny_dir else [])],
        env=code_env(path, env),
        cwd=tempfile.gettempdir(),  # `-c` puts the working directory first on sys.path
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"loading {dataset} with {path} failed: {done.stderr[-800:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dataset", default="mnist")
    p.add_argument("--repeats", type=int, default=4, help="fresh processes per copy (default 4)")
    add_code_copies(p, "load")
    p.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    p.add_argument("--out", type=Path, help="default benchmarks/results/data_loading/")
    args = p.parse_args(argv)
    out = args.out or default_out("data_loading.json", args.smoke)
    env = dict(os.environ)
    load_before = os.getloadavg()
    codes = code_copies(args)
    require_data_dir(args.smoke, "the dataset")
    dataset = "tiny" if args.smoke else args.dataset
    with tempfile.TemporaryDirectory(prefix="data-loading-") as work:
        loads: dict = {code: [] for code in codes}
        for _ in range(1 if args.smoke else args.repeats):
            for code, path in codes.items():
                loads[code].append(one_load(path, dataset, env, work if args.smoke else None))
    median = {
        code: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for code, rs in loads.items()
    }
    for code, m in median.items():
        print(
            f"{code}: {dataset} loads in {m['seconds']:.2f} s (median); the resident "
            f"set's peak grows by {m['peak_growth_mb']:.0f} MB for {m['array_mb']:.0f} MB of arrays"
        )
    figures = {
        "what": "load_dataset in fresh processes (host allocator as the CLI sets it): "
        "seconds, and growth of the resident set's peak against the arrays' bytes",
        "dataset": dataset,
        "codes": codes,
        "loads": loads,
        "median": median,
    }
    print(save_benchmark(out, figures, load_before))


if __name__ == "__main__":
    main()
