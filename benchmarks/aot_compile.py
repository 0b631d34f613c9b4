"""Every program of a preset's run compiled for a TPU, on a machine without one.

libtpu, JAX's TPU plugin, compiles for a TPU topology that is described rather than
opened (`jax.experimental.topologies`): the compiler runs on this machine's CPU and no
chip is needed. For each preset this script builds the run's population as `train`
builds it on one chip (`jaxmnist.training.loop.setup_run`: a mesh of one device, the
plans drawn on the host's CPU, a single model's batches staged), lowers its programs
from shapes alone (`Population.chunk_programs`, as the memory estimate does) and
compiles them for the described chip, one at a time, recording each program's compile
seconds. Nothing runs and nothing is placed.

jaxmnist's choices that depend on the backend (the convolution's formulation, the
augmentation's, where plans are drawn) read `jax.default_backend()`, which is this
machine's CPU here; the script answers "tpu" for them while it builds the programs.

The figures are this machine's CPU compiling for the chip, not the chip's host: slower
or faster as the two CPUs differ. They compare programs and code versions with each
other, measured side by side in one run (`--pythonpath` is not offered: run the script
from each checkout); the chip's own figures come from `tpu_time_to_result.py` there.

Needs libtpu beside JAX in this Python (`pip install 'jax[tpu]'`, best in an
environment of its own: jaxmnist sizes a TPU runtime's buffers where it finds libtpu)
and MNIST and Fashion-MNIST where JAXMNIST_DATA_DIR says. `--smoke` compiles `tpu101`
on a tiny generated dataset for this machine's CPU instead (no libtpu needed).

Usage: JAXMNIST_DATA_DIR=../shared/datasets python benchmarks/aot_compile.py
       [--presets tpu101,speedrun,speedrun8,record] [--topology v5e:1x1]
Presets as `tpu_time_to_result.py` names them (`NAME8`: 8 seeds), each optionally with
overrides, `PRESET:KEY=VALUE:...` (e.g. `speedrun:data.augment=false`). Writes JSON
(`--out`, default benchmarks/results/aot_compile/).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile
import time
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path

from benchlib.launch import require_data_dir
from benchlib.results import SMOKE_HELP, default_out, save_benchmark

PRESETS = "tpu101,codelab,cnn,speedrun,speedrun8,record,fashion_record"
TOPOLOGY = "v5e:1x1"


def parse_preset(text: str) -> tuple[str, dict[str, str]]:
    """`NAME[8][:KEY=VALUE...]` -> (preset, overrides; `train.seeds=8` among them for NAME8)."""
    name, *pairs = text.split(":")
    overrides = dict(pair.split("=", 1) for pair in pairs)
    if name.endswith("8"):
        name, overrides = name[:-1], {"train.seeds": "8", **overrides}
    return name, overrides


def describe_tpu(topology: str):
    """The first device of a described (not opened) TPU topology; one line and an exit
    where libtpu cannot describe it."""
    from jax.experimental import topologies

    try:
        topo = topologies.get_topology_desc(
            platform="tpu", topology_name=topology, chips_per_host_bounds=(1, 1, 1), num_slices=1
        )
    except Exception as e:  # noqa: BLE001 -- libtpu's own message, on one line
        sys.exit(f"aot_compile.py: libtpu cannot describe {topology!r}: {str(e).splitlines()[0]}")
    return topo.devices[0]


@contextmanager
def backend_answers(name: str):
    """`jax.default_backend()` answers `name` while jaxmnist builds the programs (module
    doc); None leaves it alone."""
    import jax

    if name is None:
        yield
        return
    real = jax.default_backend
    jax.default_backend = lambda: name
    try:
        yield
    finally:
        jax.default_backend = real


def compile_preset(device, text: str, backend: str | None, data_dir: str | None) -> dict:
    """Compiles every program of one preset's run (`parse_preset`) for `device`, one at
    a time: each program's compile seconds, and their sum."""
    import jax
    import numpy as np
    from jax.sharding import Mesh

    from jaxmnist import config as config_lib
    from jaxmnist import optim
    from jaxmnist.data.dataset import load_dataset
    from jaxmnist.training import memory, parallel
    from jaxmnist.training.population import Population, seed_members

    name, overrides = parse_preset(text)
    cfg = config_lib.apply_overrides(config_lib.get_preset(name), overrides)
    if data_dir is not None:
        cfg = config_lib.apply_overrides(cfg, {"data.data_dir": data_dir})
    dataset = load_dataset(cfg.data.dataset, cfg.data.data_dir)
    layout = parallel.Layout(Mesh(np.array([device]).reshape(1, 1), ("members", "data")))
    n_train = len(dataset.train_images) - cfg.data.validation
    plan = config_lib.plan_steps(cfg.train, n_train)
    members = seed_members(cfg)
    with backend_answers(backend):
        pop = Population(
            cfg, optim.make_optimizer(cfg.optimizer, plan.total_steps), members,
            (len(members),), dataset.train_images.shape[1:], len(dataset.spec.class_names),
            len(plan.epoch_steps), layout, ensemble=len(members) > 1,
        )  # fmt: skip
        pop.compile_workers = 1  # one at a time: each program's own seconds
        if pop.plan_device is not None and len(members) == 1:  # as `memory.stages_batches`
            pop.stage_batches()
        train, evals = memory.abstract_data(cfg, dataset, layout)
        block = next(iter(evals.values()))[0]
        start = time.perf_counter()
        pop.chunk_programs(len(members), plan.steps_per_epoch, train, block)
        seconds = time.perf_counter() - start
    programs = dict(sorted(pop.compile_times.items(), key=lambda kv: -kv[1]))
    jax.clear_caches()
    return {
        "preset": name,
        "overrides": overrides,
        "staged_batches": pop.staged,
        "compile_programs": programs,
        "compile_seconds_sum": sum(programs.values()),
        "lower_and_compile_seconds": seconds,
    }


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--presets", default=PRESETS, help=f"compiled one by one ({PRESETS})")
    p.add_argument("--topology", default=TOPOLOGY, help=f"the TPU described (default {TOPOLOGY})")
    p.add_argument("--out", type=Path, help="JSON output")
    p.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    args = p.parse_args(argv)
    require_data_dir(args.smoke)
    load_before = os.getloadavg()
    if not args.smoke:
        if importlib.util.find_spec("libtpu") is None:
            sys.exit("aot_compile.py: needs libtpu beside JAX (pip install 'jax[tpu]'), or --smoke")
        os.environ.setdefault("JAX_PLATFORMS", "cpu")  # the chip is described, never opened
        # libtpu looks for a TPU VM's metadata unless told what it is; and several
        # processes may describe a topology at once (none opens it).
        os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v5litepod-1")
        os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
        os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
    import jax

    from jaxmnist.data import registry, synthetic

    with tempfile.TemporaryDirectory(prefix="jaxmnist-aot-") as tmp:
        data_dir = None
        if args.smoke:  # the tiny dataset, registered for this run only
            arrays = synthetic.tiny_arrays()
            spec = synthetic.tiny_spec(arrays, name="tiny")
            synthetic.write_idx_folder(Path(tmp) / spec.folder, arrays, spec)
            data_dir, registry.DATASETS["tiny"] = tmp, spec
            device, backend, target = jax.devices("cpu")[0], None, "cpu"
            presets = ["tpu101:data.dataset=tiny:train.batch_size=2:train.eval_batch_size=2"]
        else:
            device, backend, target = describe_tpu(args.topology), "tpu", f"tpu {args.topology}"
            presets = args.presets.split(",")
        results = {}
        try:
            for text in presets:
                r = results[text] = compile_preset(device, text, backend, data_dir)
                top = ", ".join(f"{k} {v:.2f}" for k, v in list(r["compile_programs"].items())[:3])
                print(f"  {text:<28} {r['lower_and_compile_seconds']:7.2f} s  ({top})", flush=True)
        finally:
            if args.smoke:
                registry.DATASETS.pop("tiny", None)
    figures = {
        "smoke": args.smoke,
        "target": target,
        "libtpu": None if args.smoke else metadata.version("libtpu"),  # jax's: environment
        "presets": results,
    }
    out = args.out or default_out("aot_compile", args.smoke)
    print(save_benchmark(out, figures, load_before))


if __name__ == "__main__":
    main()
