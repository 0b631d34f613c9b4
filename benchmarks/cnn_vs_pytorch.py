"""The reference CNN in jaxmnist and in PyTorch on the same CPU, interleaved A B A B.

The model: conv 3×3 1→16, ReLU, max-pool 2; conv 3×3 16→32, ReLU, max-pool 2; dense
1568→128, ReLU; dense 128→10 (206,922 parameters, He-normal init, zero biases). Training:
Adam, one-cycle learning rate peaking at 3e-3 over the run (`optax.cosine_onecycle_schedule`
and `torch.optim.lr_scheduler.OneCycleLR` with the same shape, momentum not cycled), batch
256, a fresh shuffle every epoch, the last partial batch dropped, real MNIST.

jaxmnist: the model from the registry (`jaxmnist.models`, `model.conv_impl`) and Optax,
one jitted `lax.scan` epoch over device-resident uint8 images, compiled ahead of time.
PyTorch: eager, the uint8 images in one tensor, batches indexed from it (no DataLoader),
its default threads; bfloat16 by `torch.autocast`. Both workers set glibc to keep freed
memory (`jaxmnist.hostmem`), as the jaxmnist CLI does.

Each variant runs in its own process (XLA flags must be set before JAX starts; the two
frameworks' thread pools must not compete), the variants one after another, and the whole
sequence `--rounds` times, so that a busy machine hits all of them alike. A variant with
`steps` only times that many steps after a warm-up and scales to an epoch (for those too
slow to train, and for XLA flag trials); the others train `--epochs` epochs and are
evaluated on the test set after each (untimed). Figures: steady epoch seconds (median of
epochs 2.. over rounds), compile seconds, time to 99.0% test accuracy (training seconds
of the epochs up to the first that reaches it, median over rounds), MFU (analytic FLOPs
× examples/s over a 2048³ matmul peak measured by `jaxmnist.profiling.peak` in the same dtype,
every round). CPU model, flags and load averages are recorded.

Usage: JAXMNIST_DATA_DIR=../shared/datasets python benchmarks/cnn_vs_pytorch.py
[--rounds N] [--epochs N] [--variants "name,name"] [--out PATH] [--smoke]
`--smoke` runs one round of two epochs of jaxmnist's `auto` convolution (oneDNN where
jaxmnist-onednn is installed, else im2col) and of PyTorch in float32 on 128 random images
in batches of 16, with 128³ matmul peaks; without PyTorch it says so and runs jaxmnist's
alone.
Needs the `bench` extra (PyTorch, CPU): pip install -e '.[bench]'. Committed results, in
results/cnn_vs_pytorch/: 2026-11-30_14fed84_amd-epyc.json (every variant, 2 rounds) and
2026-12-01_48ae1ca_amd-epyc_core.json (the main comparisons and thread counts, 3 rounds:
`--rounds 3 --variants ...` as recorded).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

# JAX, jaxmnist and PyTorch are imported inside the functions that use them: a PyTorch
# worker never starts JAX (nor a JAX worker PyTorch), and the script imports, answers
# --help and orchestrates without PyTorch installed.
HERE = Path(__file__).resolve().parent
BATCH, PEAK_LR, TARGET, N_TRAIN = 256, 3e-3, 0.99, 60_000
STEPS_PER_EPOCH = N_TRAIN // BATCH
# --smoke: random images (the test set's a multiple of 10: `accuracy` evaluates it in 10
# batches), small batches, small matmul peaks.
SMOKE_TRAIN, SMOKE_TEST, SMOKE_BATCH, SMOKE_PEAK_SIZE = 128, 40, 16, 128
# name -> worker arguments. Flag trials time steps only; XLA's native CPU conv is too slow
# for whole epochs (minutes each).
VARIANTS = {
    "jax onednn float32": ["jax", "onednn", "float32"],
    "jax onednn bfloat16": ["jax", "onednn", "bfloat16"],
    "jax im2col float32": ["jax", "im2col", "float32"],
    "jax im2col bfloat16": ["jax", "im2col", "bfloat16"],
    "jax patches float32": ["jax", "patches", "float32", "--steps", "40"],
    "jax xla float32": ["jax", "xla", "float32", "--steps", "6"],
    "torch float32": ["torch", "-", "float32"],
    "torch bfloat16": ["torch", "-", "bfloat16"],
    # One thread: OpenMP's spinning barriers suffer most when other jobs share the cores.
    "torch float32 1-thread": ["torch", "-", "float32", "--steps", "40", "--threads", "1"],
    "jax im2col float32 +onednn": [
        *("jax", "im2col", "float32", "--steps", "40"),
        "--xla-flags=--xla_cpu_use_onednn=true",
    ],
    "jax im2col float32 +xnn-graph": [
        *("jax", "im2col", "float32", "--steps", "40"),
        "--xla-flags=--xla_cpu_experimental_xnn_graph_fusion_mode=XNN_GRAPH_FUSION_MODE_GREEDY",
    ],
    "jax im2col float32 +onednn-dot": [
        *("jax", "im2col", "float32", "--steps", "40"),
        "--xla-flags=--xla_cpu_use_onednn=true --xla_cpu_experimental_onednn_fusion_type=dot",
    ],
    "jax im2col float32 1-thread": [
        *("jax", "im2col", "float32", "--steps", "40"),
        "--xla-flags=--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1",
    ],
    "jax xla float32 +ynn-conv": [
        *("jax", "xla", "float32", "--steps", "6"),
        "--xla-flags=--xla_cpu_experimental_ynn_fusion_type=individual_convolution,individual_dot",
    ],
}


def reference_config(impl: str, dtype: str):
    from jaxmnist.models import model_config

    return model_config(
        "cnn", channels=(16, 32), kernel_size=(3,), hidden=(128,), dtype=dtype, conv_impl=impl
    )


def load_mnist(smoke: bool = False):
    """Real MNIST; with `smoke`, random images of its shape (`SMOKE_TRAIN`, `SMOKE_TEST`)."""
    if smoke:
        from jaxmnist.bench.measure import synthetic_dataset

        return synthetic_dataset("mnist", train_size=SMOKE_TRAIN, test_size=SMOKE_TEST)
    from jaxmnist.data import load_dataset

    return load_dataset("mnist", os.environ.get("JAXMNIST_DATA_DIR"), download=False)


def sizes(smoke: bool) -> tuple[int, int, int]:
    """(training examples, batch size, steps per epoch)."""
    n_train, batch = (SMOKE_TRAIN, SMOKE_BATCH) if smoke else (N_TRAIN, BATCH)
    return n_train, batch, n_train // batch


def run_jax(impl: str, dtype: str, epochs: int, steps: int | None, smoke: bool = False) -> dict:
    import jax
    import jax.numpy as jnp
    import optax

    from jaxmnist.models import apply_uint8, get_model

    ds, cfg, model = load_mnist(smoke), reference_config(impl, dtype), get_model("cnn")
    n_train, batch, steps_per_epoch = sizes(smoke)
    n_steps = steps or steps_per_epoch
    optimizer = optax.adam(optax.cosine_onecycle_schedule(epochs * steps_per_epoch, PEAK_LR))
    params = model.init(jax.random.key(0), cfg, (28, 28), 10)
    state = (params, optimizer.init(params))
    images, labels = jax.device_put((ds.train_images, ds.train_labels.astype("int32")))
    test_x, test_y = jax.device_put((ds.test_images, ds.test_labels.astype("int32")))

    def loss_fn(params, x, y):
        logits = apply_uint8(params, x, cfg)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    def epoch(state, key, images, labels):
        def step(state, idx):
            params, opt_state = state
            loss, grads = jax.value_and_grad(loss_fn)(params, images[idx], labels[idx])
            updates, opt_state = optimizer.update(grads, opt_state, params)
            return (optax.apply_updates(params, updates), opt_state), loss

        idx = jax.random.permutation(key, n_train)[: n_steps * batch].reshape(n_steps, batch)
        return jax.lax.scan(step, state, idx)

    def accuracy(params, x, y):
        logits = jax.vmap(lambda xb: apply_uint8(params, xb, cfg))(x.reshape(10, -1, 28, 28))
        return jnp.mean(jnp.argmax(logits, -1).reshape(-1) == y)

    key = jax.random.key(1)
    start = time.perf_counter()
    run_epoch = jax.jit(epoch, donate_argnums=0).lower(state, key, images, labels).compile()
    compile_seconds = time.perf_counter() - start
    evaluate = jax.jit(accuracy).lower(params, test_x, test_y).compile()

    def one_epoch(state, e):
        start = time.perf_counter()
        state, loss = jax.block_until_ready(
            run_epoch(state, jax.random.fold_in(key, e), images, labels)
        )
        return state, time.perf_counter() - start, loss

    return _drive(
        one_epoch,
        state,
        epochs,
        steps,
        compile_seconds,
        lambda s: float(evaluate(s[0], test_x, test_y)),
        n_steps * batch,
    )


def run_torch(
    dtype: str, epochs: int, steps: int | None, threads: int | None, smoke: bool = False
) -> dict:
    import torch
    from torch import nn

    if threads:
        torch.set_num_threads(threads)

    ds = load_mnist(smoke)
    n_train, batch, steps_per_epoch = sizes(smoke)
    torch.manual_seed(0)
    net = nn.Sequential(
        *(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)),
        *(nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)),
        *(nn.Flatten(), nn.Linear(1568, 128), nn.ReLU(), nn.Linear(128, 10)),
    )
    for m in net:
        if isinstance(m, nn.Conv2d | nn.Linear):  # He-normal, zero biases: as jaxmnist
            nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
            nn.init.zeros_(m.bias)
    opt = torch.optim.Adam(net.parameters(), lr=PEAK_LR)
    sched = torch.optim.lr_scheduler.OneCycleLR(
        opt,
        PEAK_LR,
        total_steps=epochs * steps_per_epoch + 1,
        pct_start=0.3,
        anneal_strategy="cos",
        div_factor=25.0,
        final_div_factor=1e4,
        cycle_momentum=False,
    )
    images, labels = (
        torch.from_numpy(ds.train_images.copy()),
        torch.from_numpy(ds.train_labels.astype("int64")),
    )
    test_x = torch.from_numpy(ds.test_images.copy()).float().div_(255).unsqueeze(1)
    test_y = torch.from_numpy(ds.test_labels.astype("int64"))
    autocast = torch.autocast("cpu", torch.bfloat16, enabled=dtype == "bfloat16")
    n_steps = steps or steps_per_epoch
    gen = torch.Generator().manual_seed(1)

    def one_epoch(state, e):
        start = time.perf_counter()
        idx = torch.randperm(n_train, generator=gen)[: n_steps * batch].view(n_steps, batch)
        for rows in idx:
            x = images[rows].float().div_(255).unsqueeze(1)
            with autocast:
                loss = nn.functional.cross_entropy(net(x), labels[rows])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
        return state, time.perf_counter() - start, None

    def evaluate(state):
        with torch.no_grad(), autocast:
            return float((net(test_x).argmax(-1) == test_y).float().mean())

    out = _drive(one_epoch, None, epochs, steps, 0.0, evaluate, n_steps * batch)
    out["torch"] = {
        "version": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }
    return out


def _drive(one_epoch, state, epochs, steps, compile_seconds, evaluate, examples) -> dict:
    """Timed-steps mode: one warm-up window, two timed, scaled to an epoch. Training mode:
    `epochs` timed epochs, test accuracy after each. `examples`: an epoch's (its steps
    times the batch)."""
    if steps:
        state, _, _ = one_epoch(state, 0)
        seconds = []
        for e in (1, 2):
            state, s, _ = one_epoch(state, e)
            seconds.append(s * STEPS_PER_EPOCH / steps)
        return {
            "compile_seconds": compile_seconds,
            "epoch_seconds": seconds,
            "steps_timed": steps,
            "examples_per_epoch": STEPS_PER_EPOCH * BATCH,  # the epoch it is scaled to
        }
    seconds, accuracy = [], []
    for e in range(epochs):
        state, s, _ = one_epoch(state, e)
        seconds.append(s)
        accuracy.append(evaluate(state))
    return {
        "compile_seconds": compile_seconds,
        "epoch_seconds": seconds,
        "test_accuracy": accuracy,
        "examples_per_epoch": examples,
    }


def run_peaks(n: int = 2048) -> dict:
    """Matmul peaks, n³, float32 and bfloat16: XLA (jaxmnist.profiling.peak) and PyTorch."""
    from jaxmnist.profiling.peak import measure_matmul_peak

    out = {}
    for dtype in ("float32", "bfloat16"):
        out[f"jax {dtype}"] = measure_matmul_peak(dtype, n)["flops_per_second"]["median"]
    try:
        import torch
    except ImportError:
        return out
    for dtype in ("float32", "bfloat16"):
        a = torch.randn(n, n).to(getattr(torch, dtype))
        b = torch.linalg.qr(torch.randn(n, n))[0].to(a.dtype)
        a @ b
        times = []
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(5):
                a = a @ b
            times.append((time.perf_counter() - start) / 5)
        out[f"torch {dtype}"] = 2 * n**3 / statistics.median(times)
    return out


def worker(argv: list[str]) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("framework", choices=["jax", "torch", "peak"])
    p.add_argument("impl")
    p.add_argument("dtype")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--steps", type=int)
    p.add_argument("--xla-flags", default="")
    p.add_argument("--threads", type=int)
    p.add_argument("--smoke", action="store_true")
    a = p.parse_args(argv)
    from jaxmnist import hostmem

    hostmem.keep_freed_memory()  # as the CLI does; the same glibc settings for both frameworks
    if a.framework == "peak":
        result = run_peaks(SMOKE_PEAK_SIZE if a.smoke else 2048)
    elif a.framework == "jax":
        result = run_jax(a.impl, a.dtype, a.epochs, a.steps, a.smoke)
    else:
        result = run_torch(a.dtype, a.epochs, a.steps, a.threads, a.smoke)
    print("RESULT " + json.dumps(result), flush=True)


def _cpu_flags() -> list[str]:
    try:
        with open("/proc/cpuinfo") as f:
            flags = next(line for line in f if line.startswith("flags")).split(":", 1)[1]
    except (OSError, StopIteration):
        return []
    keep = ("avx2", "fma", "avx512", "amx", "avx_vnni")
    return sorted(f for f in flags.split() if f.startswith(keep))


def _run_worker(args: list[str], epochs: int, smoke: bool = False) -> dict:
    cmd = [sys.executable, __file__, "--worker", *args[:3], "--epochs", str(epochs), *args[3:]]
    cmd += ["--smoke"] if smoke else []
    env = dict(os.environ)
    flags = [a.split("=", 1)[1] for a in args if a.startswith("--xla-flags=")]
    env["XLA_FLAGS"] = " ".join(flags)
    load, start = os.getloadavg()[0], time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    if proc.returncode or not lines:
        raise RuntimeError(f"{' '.join(args)} failed:\n{proc.stderr[-3000:]}")
    out = json.loads(lines[-1][len("RESULT ") :])
    out.update(load_before=load, load_after=os.getloadavg()[0])
    out["wall_seconds"] = time.perf_counter() - start
    return out


def _time_to_target(run: dict) -> float | None:
    total = 0.0
    for seconds, acc in zip(run["epoch_seconds"], run.get("test_accuracy", []), strict=False):
        total += seconds
        if acc >= TARGET:
            return total
    return None


def summarize(name: str, runs: list[dict], peaks: list[dict]) -> dict:
    from jaxmnist.models import get_model

    framework, _, dtype = VARIANTS[name][:3]
    timed_steps = "test_accuracy" not in runs[0]
    epochs = [
        s for r in runs for s in (r["epoch_seconds"] if timed_steps else r["epoch_seconds"][1:])
    ]
    steady = statistics.median(epochs)
    flops = get_model("cnn").flops_per_example(reference_config("auto", dtype), (28, 28), 10)
    achieved = flops * runs[0]["examples_per_epoch"] / steady
    reached = [t for t in map(_time_to_target, runs) if t is not None]
    row = {
        "variant": name,
        "steady_epoch_seconds": steady,
        "epoch_seconds_range": [min(epochs), max(epochs)],
        "epoch_samples": len(epochs),
        "extrapolated_from_steps": runs[0].get("steps_timed"),
        "compile_seconds": statistics.median(r["compile_seconds"] for r in runs),
        "achieved_gflops": achieved / 1e9,
        "mfu_vs_xla_peak": achieved / statistics.median(p[f"jax {dtype}"] for p in peaks),
        "time_to_99_seconds": statistics.median(reached) if reached else None,
        "rounds_reaching_99": f"{len(reached)}/{len(runs)}" if not timed_steps else None,
        "final_test_accuracy": [r["test_accuracy"][-1] for r in runs] if not timed_steps else None,
        "runs": runs,
    }
    if framework == "torch" and all(f"torch {dtype}" in p for p in peaks):
        row["mfu_vs_torch_peak"] = achieved / statistics.median(p[f"torch {dtype}"] for p in peaks)
    return row


def _rounds(a, names, runs, peaks) -> None:
    """Every variant, one after another, `a.rounds` times (A B A B)."""
    for r in range(a.rounds):
        peaks.append(_run_worker(["peak", "-", "-"], 1, a.smoke))
        print(
            f"round {r + 1}: peaks "
            + ", ".join(
                f"{k} {v / 1e9:.0f}" for k, v in peaks[-1].items() if k.startswith(("jax", "torch"))
            )
            + " GFLOP/s",
            flush=True,
        )
        for n in names:
            out = _run_worker(VARIANTS[n], a.epochs, a.smoke)
            runs[n].append(out)
            acc = out.get("test_accuracy")
            print(
                f"round {r + 1}: {n}: epochs {[round(s, 1) for s in out['epoch_seconds']]} s"
                + (f", test accuracy {[round(x, 4) for x in acc]}" if acc else "")
                + f", load {out['load_before']:.1f}",
                flush=True,
            )


def _spin() -> subprocess.Popen:
    """A process that keeps one core busy until killed."""
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def _fmt(x, spec):
    return "-" if x is None else format(x, spec)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:  # one variant, in a process of its own (`_run_worker`)
        worker(argv[1:])
        return
    from importlib import metadata, util

    from jaxmnist import runtime
    from jaxmnist.models import onednn

    from benchlib.results import SMOKE_HELP, default_out, provenance

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--epochs", type=int, default=3, help="training epochs (one-cycle length)")
    p.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated names")
    p.add_argument("--out", help="JSON output (default: a new record in results/cnn_vs_pytorch/)")
    p.add_argument(
        "--busy-core",
        action="store_true",
        help="keep one core busy with a spinning process for the whole run, both sides alike "
        "(the machine shared with another job)",
    )
    p.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    a = p.parse_args(argv)
    names = [n.strip() for n in a.variants.split(",")]
    if a.smoke:
        jax_impl = "onednn" if onednn.available() else "im2col"
        names, a.rounds, a.epochs = [f"jax {jax_impl} float32", "torch float32"], 1, 2
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        sys.exit(f"unknown variants {unknown}; choose from: {', '.join(VARIANTS)}")
    torch_variants = [n for n in names if VARIANTS[n][0] == "torch"]
    if torch_variants and util.find_spec("torch") is None:
        if not a.smoke:
            sys.exit(
                f"{', '.join(torch_variants)}: PyTorch is not installed "
                "(pip install -e '.[bench]', a CPU build of torch first)"
            )
        print("PyTorch is not installed: the smoke run skips its variant", flush=True)
        names = [n for n in names if n not in torch_variants]
    runs: dict[str, list] = {n: [] for n in names}
    peaks = []
    spinner = _spin() if a.busy_core else None
    try:
        _rounds(a, names, runs, peaks)
    finally:
        if spinner is not None:
            spinner.kill()
            spinner.wait()
    rows = [summarize(n, runs[n], peaks) for n in names]
    by_name = {row["variant"]: row for row in rows}
    ratios = {}
    for impl, dtype in itertools.product(("onednn", "im2col"), ("float32", "bfloat16")):
        j, t = by_name.get(f"jax {impl} {dtype}"), by_name.get(f"torch {dtype}")
        if j and t:
            ratios[f"jax {impl}/torch steady epoch {dtype}"] = (
                j["steady_epoch_seconds"] / t["steady_epoch_seconds"]
            )
    env = runtime.environment()
    env.update(cpu_flags=_cpu_flags(), torch=_version(metadata, "torch"))
    result = {
        "benchmark": "reference CNN, jaxmnist vs PyTorch, CPU",
        "model": "conv3x3 1-16 relu pool2, conv3x3 16-32 relu pool2, dense 1568-128 relu, 128-10",
        "training": {
            "optimizer": "adam",
            "schedule": "one-cycle",
            "peak_lr": PEAK_LR,
            "batch_size": sizes(a.smoke)[1],
            "epochs": a.epochs,
            "target_accuracy": TARGET,
        },
        "rounds": a.rounds,
        "busy_core": a.busy_core,
        "note": "variants run one after another in separate processes, the sequence repeated "
        "each round (A B A B); load averages per run"
        + ("; one core kept busy by a spinning process throughout" if a.busy_core else ""),
        "environment": env,
        "peaks_flops_per_second": peaks,
        "results": rows,
        "ratios": ratios,
        "target": {"jax onednn/torch steady epoch float32": 0.7 if a.busy_core else 0.5},
        "provenance": provenance(),
    }
    out = Path(a.out) if a.out else default_out("cnn_vs_pytorch", a.smoke)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1))
    os.replace(tmp, out)
    print(
        f"\n{'variant':32} {'epoch s':>8} {'compile':>7} {'GFLOP/s':>8} {'MFU':>5} "
        f"{'to 99% s':>8} {'final acc':>9}"
    )
    for row in rows:
        final = row["final_test_accuracy"]
        print(
            f"{row['variant']:32} {row['steady_epoch_seconds']:8.2f} "
            f"{row['compile_seconds']:7.1f} {row['achieved_gflops']:8.1f} "
            f"{row['mfu_vs_xla_peak']:5.2f} {_fmt(row['time_to_99_seconds'], '8.1f')} "
            f"{_fmt(statistics.median(final) if final else None, '9.4f')}"
        )
    for k, v in ratios.items():
        print(f"{k}: {v:.2f}")
    print(f"wrote {out}")


def _version(metadata, package):
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


if __name__ == "__main__":
    main()
