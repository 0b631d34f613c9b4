"""Which reader gives each benchmark's figures on the Results page, and what it measures.

`BENCHMARKS` maps each folder of benchmarks/results/ to a `Benchmark`: what it measures
(a sentence with no figure in it), how it is run, and `figures`, the reader of its
records (`figures_model`, `figures_run`) into rows of (what, figure). Every figure on the
Results page comes from one of these readers, formatted from the record's own values;
none is typed here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import figures_model as model
import figures_run as run

Rows = list[tuple[str, str]]


@dataclass(frozen=True)
class Benchmark:
    what: str  # what it measures: a sentence without figures
    figures: Callable[[dict], Rows] | None  # a record -> its rows; None: logs, no figures
    source: str = ""  # how it is run, where that is not `python benchmarks/<folder>.py`


REMOVED = (
    "its script, which left `benchmarks/` once the choice was made: `git show {}:benchmarks/{}.py`"
)

BENCHMARKS = {
    "accelerator_session": Benchmark(
        "The logs of the accelerator sessions: each step's command, its output and its time.",
        None,
        "`bash benchmarks/accelerator_session.sh`",
    ),
    "augment_gathers": Benchmark(
        "The augmentation's gathers (random translation, affine warp, a batch's rows) against "
        "their dense forms, per step of a scan.",
        model.augment_gathers,
        REMOVED.format("d66f7df", "augment_gathers"),
    ),
    "batch_norm_cost": Benchmark(
        "What batch normalisation costs a layer and a `speedrun` step.",
        model.batch_norm_cost,
        REMOVED.format("d66f7df", "batch_norm_cost"),
    ),
    "bench_tpu101": Benchmark(
        "The `tpu101` training step in each way of driving it (eager, jitted steps, a compiled "
        "epoch), dtypes and batch sizes, with MFU.",
        model.bench,
        "`jaxmnist bench --preset tpu101`",
    ),
    "bf16_matmul": Benchmark(
        "The bfloat16 dtype against float32: a large matmul and the presets' steps.",
        model.bf16_matmul,
        REMOVED.format("d66f7df", "bf16_matmul"),
    ),
    "checkpoint_overhead": Benchmark(
        "What a checkpoint each epoch costs, and a run killed with SIGKILL, then resumed.",
        run.checkpoint_overhead,
    ),
    "cnn_presets": Benchmark(
        "The CNN presets' test accuracy as the mean over seeds, and their training time.",
        model.cnn_presets,
    ),
    "cnn_vs_pytorch": Benchmark(
        "The reference CNN's training epoch in jaxmnist and in PyTorch on the same CPU, "
        "interleaved.",
        model.cnn_vs_pytorch,
    ),
    "aot_compile": Benchmark(
        "Each preset's programs compiled for a TPU on a machine without one (libtpu's "
        "described topology), one at a time.",
        run.aot_compile,
    ),
    "compile_time": Benchmark(
        "Each preset's compile with every cache off: a user's first run.", run.compile_time
    ),
    "conv_backward": Benchmark(
        "The im2col convolution's backward pass written out, against autodiff's.",
        model.speedups,
        REMOVED.format("4b115f5", "conv_backward"),
    ),
    "data_loading": Benchmark(
        "Loading a dataset: its time, and how far the peak memory grows.", run.data_loading
    ),
    "devices_scaling": Benchmark(
        "Data- and seed-parallel training over fake CPU devices: the cost of splitting, not a "
        "speed-up.",
        model.devices_scaling,
    ),
    "epoch_versions": Benchmark(
        "Steady training epochs of two copies of the code, taking turns.",
        model.side_by_side("steady epoch (median)"),
        REMOVED.format("4b115f5", "epoch_versions"),
    ),
    "epoch_vs_tutorial": Benchmark(
        "The compiled epoch and the whole program against the TPU 101 tutorial's loop.",
        model.epoch_vs_tutorial,
    ),
    "eval_overhead": Benchmark(
        "Evaluation after each epoch as a share of a preset's training time.", run.eval_overhead
    ),
    "first_block": Benchmark(
        "A kernel of jaxmnist's own for the CNN's first block, against the oneDNN calls it "
        "replaced (since removed).",
        model.first_block,
        REMOVED.format("3318e96^", "first_block"),
    ),
    "first_conv": Benchmark(
        "A grayscale first layer's formulations side by side (`auto`, `banded`, `patches`, "
        "`xla`), the other layers as `auto` has them: whole runs' compile and steady epoch.",
        model.first_conv,
    ),
    "host_memory": Benchmark(
        "Freed host memory kept for reuse (`jaxmnist.hostmem`), with and without the growth "
        "check, against glibc's defaults.",
        run.host_memory,
    ),
    "memory_estimate": Benchmark(
        "The memory estimate against the measured peak, case by case.", run.memory_estimate
    ),
    "onednn_pool": Benchmark(
        "Max-pooling through oneDNN's calls against the written-out gradient.",
        model.speedups,
        REMOVED.format("4b115f5", "onednn_pool"),
    ),
    "pacing_overhead": Benchmark(
        "An epoch in calls that end by time, against one call per epoch.",
        model.pacing_overhead,
        REMOVED.format("4b115f5", "pacing_overhead"),
    ),
    "profile_cnn": Benchmark(
        "Where a `cnn` training step's time goes, by kind of operation.",
        model.profile,
        "`jaxmnist profile --preset cnn`",
    ),
    "profile_record": Benchmark(
        "Where a `record` training step's time goes, by kind of operation.",
        model.profile,
        "`jaxmnist profile --preset record`",
    ),
    "record": Benchmark(
        "The record presets as a user runs them, and the validation-split trials that chose "
        "their recipes.",
        model.record,
    ),
    "run_layer_before_after": Benchmark(
        "The run layer's reshaping: the code before and after it, alternated.",
        model.run_layer_before_after,
        "the commands the record names, by hand",
    ),
    "run_overhead": Benchmark(
        "What the report adds to a `tpu101` run, and the training process's peak memory.",
        run.run_overhead,
    ),
    "search_pruning": Benchmark(
        "The median pruner against none in `jaxmnist search`.",
        run.search_pruning,
        REMOVED.format("4b115f5", "search_pruning"),
    ),
    "seeds_vs_single": Benchmark(
        "Eight seeds in one program against one seed, whole programs side by side.",
        model.seeds_vs_single,
    ),
    "serve_load": Benchmark(
        "The `jaxmnist serve` server under load from concurrent clients on loopback.",
        run.serve_load,
    ),
    "shuffle": Benchmark(
        "The epoch's shuffle from one-operand sorts, against `jax.random.permutation`.",
        model.shuffle,
        REMOVED.format("4b115f5", "shuffle"),
    ),
    "staged_batches": Benchmark(
        "Each epoch's batches gathered before its steps (by the host as it draws the plan; "
        "the first record: by a TPU program, not kept), against the steps' own gather: "
        "whole runs' compile and steady epoch.",
        model.staged_batches,
    ),
    "startup": Benchmark(
        "The command line's start-up, and importing the computing stack.", run.startup
    ),
    "stop_latency": Benchmark(
        "How soon Ctrl-C or SIGTERM stops a run inside an epoch.", run.stop_latency
    ),
    "tpu/time_to_result": Benchmark(
        "A user's first and second `tpu101` run against the TPU 101 tutorial's, and every "
        "preset's compile from an empty cache.",
        run.time_to_result,
        "`python benchmarks/tpu_time_to_result.py`",
    ),
}
