"""One run, start to end: `train_and_evaluate(cfg, workdir, callbacks)`.

The recipe of a run, in the order it happens: set up (the mesh, the compilation
cache, the data, the callbacks that write the run directory), restore (a resumed
run's newest checkpoint, through `start`), compile and loop (`loop.train_population`),
summarise (summary.json's figures), and hand the end to every callback. The run
directory, TensorBoard, checkpoints and the terminal are all callbacks: this
module writes no file itself. In a multi-process run only process 0 writes the
run directory; every process checkpoints (an Orbax save is collective).

It composes what the packages below it own, and none of them imports it: the loop
(`training`), the run directory and checkpoints (`runs`), TensorBoard (`report`).
"""

from __future__ import annotations

import os
import time
from concurrent.futures import Future, ThreadPoolExecutor

import jax
import numpy as np

from jaxmnist import config as config_lib
from jaxmnist import runtime, stats
from jaxmnist.data import load_dataset
from jaxmnist.errors import TrainingError
from jaxmnist.models import param_shapes
from jaxmnist.runs import reader
from jaxmnist.runs import resume as resume_lib
from jaxmnist.runs.checkpoint import Checkpointer, CheckpointOptions
from jaxmnist.runs.writer import RunWriter
from jaxmnist.training import evaluate as evaluate_lib
from jaxmnist.training import parallel, population
from jaxmnist.training.hooks import Callback, Callbacks, RunEnd, RunResult
from jaxmnist.training.loop import train_population
from jaxmnist.training.population import seed_members
from jaxmnist.training.preemption import Stopped, StopRequest

__all__ = ["train_and_evaluate"]


def train_and_evaluate(
    cfg: config_lib.Config,
    workdir: str | os.PathLike | None,
    callbacks: Callback | list[Callback | None] | tuple = (),
    *,
    dataset=None,
    layout: parallel.Layout | None = None,
    checkpoints: CheckpointOptions | None = None,
    resume: resume_lib.Resumer | None = None,
    stop: StopRequest | None = None,
    command: list[str] | None = None,
) -> dict:
    """Trains and evaluates `cfg.train.seeds` models as `cfg` says; returns the summary.

    With a `workdir`, the run directory is written there (`runs.rundir` lists its
    files), Orbax checkpoints too with `checkpoints`; `resume` (`runs.resume.Resumer`)
    continues workdir from its newest checkpoint; `stop` ends the run within about a
    second, after a checkpoint, with `preemption.Stopped`. `callbacks` get every hook
    (`hooks.Callback`), in every process. `layout` is the mesh a caller built from a
    validated `cfg`; without one, this is the entry point: it validates `cfg` and
    builds the mesh. `dataset` (a `data.Dataset`) skips loading, for tests. `command`:
    the command line, written to command.txt when the run starts.
    """
    wall_start = time.perf_counter()
    if layout is None:
        n_train = None if dataset is None else len(dataset.train_labels)
        config_lib.validate(cfg, num_train_examples=n_train)
        t = cfg.train
        layout = parallel.layout_for(cfg.parallel, num_models=t.seeds, batch_size=t.batch_size)
    if cfg.compile_cache:
        runtime.enable_compilation_cache()
    if dataset is None and resume is not None:
        # Where training found its data (data.json), as `eval` does: $JAXMNIST_DATA_DIR
        # may be unset where it resumes. cfg's data_dir (training's, or the resume's
        # --data-dir) comes first; different checksums there are refused.
        why = "resuming on it would not continue the same run"
        dataset = reader.load_run_dataset(workdir, cfg, cfg.data.data_dir, why)
    elif dataset is None:
        dataset = load_dataset(cfg.data.dataset, cfg.data.data_dir, download=cfg.data.download)
    writes = workdir is not None and parallel.is_main_process()
    files = RunWriter(workdir, resuming=resume is not None, command=command) if writes else None
    events = _events(workdir) if writes and cfg.tensorboard else None
    saver = Checkpointer(workdir, checkpoints) if workdir and checkpoints else None
    calls = Callbacks([*Callbacks(callbacks).items, files, events, saver])
    # The saved predictions' program compiles while the run's own compile and train,
    # where programs compile at once (not on a CPU: `population.compile_workers`); an
    # ensemble run saves the ensemble's, which its evaluation computes anyway.
    ensemble = cfg.train.seeds > 1
    ahead = writes and not ensemble and population.compile_workers(jax.default_backend()) > 1
    predict = _compile_predict(cfg, dataset) if ahead else None
    try:
        try:
            result = train_population(
                cfg,
                seed_members(cfg),
                dataset,
                calls,
                layout=layout,
                start=resume,
                interrupt=stop and (lambda: stop.requested),
                every_steps=(checkpoints.every_steps,) if saver else (),
            )
        except TrainingError as e:  # a non-finite loss: the bad state was never checkpointed
            if files and saver:
                resume_lib.mark_diverged(workdir, str(e))
            raise
        finally:
            if saver:
                saver.close()  # waits for the last asynchronous write
        complete = result.steps == result.plan.total_steps or all(result.reached)
        if result.stopped and not complete:  # a late signal changes nothing
            raise Stopped(
                f"stopped at step {result.steps}; resume with: jaxmnist train --resume {workdir}",
                stop.exit_code,
                result.steps,
            )
        summary = summarise(cfg, result, dataset, layout, time.perf_counter() - wall_start)
        params = result.population.params(result.states)  # every process: a collective gather
        probs, whose = _test_probabilities(cfg, result, params, dataset, predict, writes)
        calls.on_finish(RunEnd(summary, result, params, probs, dataset, whose))
    finally:
        if events:
            events.close()
    return summary


def summarise(cfg, r: RunResult, dataset, layout: parallel.Layout, wall_seconds: float) -> dict:
    """summary.json: the final figures, timings and, with several models, their spread."""
    models = len(r.population)
    summary = {
        "dataset": dataset.spec.name,
        "test_accuracy": float(r.test.accuracy.mean()),
        "test_loss": float(r.test.loss.mean()),
        "train_loss": r.records[-1]["train_loss"],
        "train_accuracy": r.records[-1]["train_accuracy"],
        **{k: r.records[-1][k] for k in ("train_set_loss",) if k in r.records[-1]},
        # What train_accuracy covers: the full training set, or a fixed subset of it.
        **{k: r.info[k] for k in ("train_eval_examples", "train_eval_subset_seed") if k in r.info},
        "num_test_examples": r.test.count,
        "num_params": r.info["num_params"],
        "epochs": len(r.records),
        "steps": r.steps,
        "compile_seconds": r.compile_seconds,
        "compile_programs": r.info.get("compile_programs", {}),
        "train_seconds": r.train_seconds,
        "eval_seconds": r.eval_seconds,
        "examples_per_second": r.steps * cfg.train.batch_size * models / r.train_seconds,
        "steady_epoch_seconds": _steady_epoch_seconds(r.records, r.plan),
        "devices": layout.size,
        "mesh": layout.describe()["mesh"],
        "wall_seconds": wall_seconds,
    }
    if models > 1:
        summary.update(_seed_summary(r))
    summary.update(_val_summary(r))
    if r.ensemble is not None:  # the mean of every member's probabilities
        summary.update(
            ensemble_members=models,
            ensemble_test_accuracy=r.ensemble.accuracy,
            ensemble_test_loss=r.ensemble.loss,
        )
    if cfg.train.target_accuracy is not None:
        summary.update(_target_summary(cfg, r))
    return summary


def _seed_summary(r: RunResult) -> dict:
    """The multi-seed fields: the seeds, the test accuracy's mean, std, 95% CI, min and
    max, and the per-seed figures."""
    acc = r.test.accuracy
    return {
        "seeds": [m.seed for m in r.population.members],
        **stats.spread(acc).to_json("test_accuracy"),
        "test_accuracy_per_seed": acc.tolist(),
        "test_loss_per_seed": r.test.loss.tolist(),
        "train_accuracy_per_seed": r.records[-1]["train_accuracy_per_seed"],
        "chunks": list(r.population.chunks),
    }


def _val_summary(r: RunResult) -> dict:
    """The validation split's figures after the last epoch (`data.validation`), under the
    test figures' names with `val_` for `test_` (the ensemble's too), and the seed that drew
    it; empty without one."""
    last = r.records[-1]
    if "val_accuracy" not in last:
        return {}
    out = {
        "val_accuracy": last["val_accuracy"],
        "val_loss": last["val_loss"],
        "num_val_examples": r.info["validation_examples"],
        "validation_seed": r.info["validation_seed"],
    }
    if "val_accuracy_per_seed" in last:
        out.update(
            **stats.spread(last["val_accuracy_per_seed"]).to_json("val_accuracy"),
            val_accuracy_per_seed=last["val_accuracy_per_seed"],
            val_loss_per_seed=last["val_loss_per_seed"],
        )
    # Several seeds: their ensemble on the split too.
    out.update({k: last[k] for k in ("ensemble_val_accuracy", "ensemble_val_loss") if k in last})
    return out


def _target_summary(cfg, r: RunResult) -> dict:
    reached = r.reached[0]
    return {
        "target_accuracy": cfg.train.target_accuracy,
        "target_split": cfg.train.target_split,
        "target_reached": reached is not None,
        "epochs_planned": len(r.plan.epoch_steps),
        "epochs_to_target": reached and reached["epoch"],
        "time_to_target_seconds": reached and reached["train_seconds"],
        "time_to_target_with_compile_seconds": reached
        and reached["train_seconds"] + r.compile_seconds,
    }


def _steady_epoch_seconds(records: list[dict], plan) -> float | None:
    """Median time of full epochs after the first (which may still warm caches)."""
    full = [
        r["epoch_seconds"]
        for r, n in zip(records, plan.epoch_steps, strict=False)
        if n == plan.steps_per_epoch
    ]
    return float(np.median(full[1:])) if len(full) > 1 else None


def _compile_predict(cfg, dataset) -> Future:
    """The program of `_first_member_probabilities`, compiling on a thread of its own."""
    device = jax.sharding.SingleDeviceSharding(parallel.default_device())
    shapes = param_shapes(  # from a raw key's shape: no key is made on the device
        cfg.model, dataset.train_images.shape[1:], len(dataset.spec.class_names)
    )
    params = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device), shapes)
    pool = ThreadPoolExecutor(1, thread_name_prefix="jaxmnist-compile")
    future = pool.submit(
        evaluate_lib.predict_program,
        cfg.model,
        params,
        dataset.test_images.shape,
        cfg.train.eval_batch_size,
    )
    pool.shutdown(wait=False)
    return future


def _test_probabilities(
    cfg, result, params, dataset, predict: Future | None, writes: bool
) -> tuple[np.ndarray | None, str]:
    """The test-set probabilities saved with the run for its report, float32 (N, C), and
    whose they are: an ensemble run's, the ensemble's (its last evaluation's, already on
    the device); else the first member's (`_first_member_probabilities`). (None, "")
    for a process that writes nothing."""
    if not writes:
        return None, ""
    if result.ensemble_log_probs is not None:
        log_probs = np.asarray(jax.device_get(result.ensemble_log_probs), np.float32)
        n, classes = len(dataset.test_labels), log_probs.shape[-1]
        probs = np.exp(log_probs.reshape(-1, classes)[:n])  # the padded rows come last
        return probs, f"the ensemble of {len(result.population)} members"
    probs = _first_member_probabilities(cfg, params, dataset, predict)
    return probs, f"seed {cfg.train.seed}"


def _first_member_probabilities(cfg, params, dataset, predict: Future | None) -> np.ndarray:
    """float32 (N, C): the first member's test-set probabilities, for reports; `predict`:
    their program, compiling (`_compile_predict`)."""
    first = jax.device_put(jax.tree.map(lambda x: x[0], params), parallel.default_device())
    try:
        program = predict and predict.result()
    except Exception:  # noqa: BLE001 -- compiled again below, where its error would show
        program = None
    return evaluate_lib.predict_probabilities(
        cfg.model, first, dataset.test_images, cfg.train.eval_batch_size, program
    )


def _events(workdir):
    """TensorBoard's callback; imported only when asked for (start-up: tensorboardX)."""
    from jaxmnist.report.tensorboard import Events  # start-up: tensorboardX and matplotlib

    return Events(workdir)
