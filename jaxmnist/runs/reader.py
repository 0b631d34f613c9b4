"""Reading a run directory back: the one reader of a run's config, data and parameters.

`open_run(path)` is what `eval`, `predict`, `export`, `serve`, the report and
`--resume` start from. It reads config.json into a `Config`, says which dataset
the run was trained on and where that data was found (data.json), and reads every
member's parameters: from params.npz once the run has finished (summary.json is
written last), else from the newest intact checkpoint, saying so. Parameters
always come back stacked along a leading member axis, one model or many.

Two kinds of bad run directory, each with its own error and exit code:
`NotARunError` (exit 2: no such directory, no config.json, nothing trained yet)
and `CorruptRunError` (exit 1: a config.json, params.npz or every checkpoint that
cannot be read back).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import numpy as np

from jaxmnist import config as config_lib
from jaxmnist import optim
from jaxmnist.data import DatasetSpec, get_spec, load_dataset
from jaxmnist.data.locate import scan
from jaxmnist.errors import CorruptRunError, DataError, JaxmnistError, NotARunError
from jaxmnist.runs import checkpoint, rundir
from jaxmnist.training import parallel
from jaxmnist.training.step import init_state, model_params


@dataclass(frozen=True)
class Run:
    """A run directory read back (see the module doc)."""

    path: Path
    config: config_lib.Config
    spec: DatasetSpec  # the dataset it was trained on
    params: Any  # every member's parameters on the host, member axis first
    source: str  # where the parameters came from, in words
    finished: bool  # summary.json is there
    checkpoint_step: int | None = None  # an unfinished run: the checkpoint read
    checkpoint_epoch: int | None = None

    @property
    def members(self) -> int:
        return jax.tree.leaves(self.params)[0].shape[0]

    @property
    def seeds(self) -> list[int]:
        return [self.config.train.seed + i for i in range(self.members)]

    def member_params(self, index: int):
        """Member `index`'s parameters, unstacked (host arrays)."""
        return jax.tree.map(lambda x: x[index], self.params)

    def summary(self) -> dict | None:
        """summary.json, or None for an unfinished run."""
        if not self.finished:
            return None
        return _read_json(self.path / rundir.SUMMARY_FILE, "summary")

    def data_record(self) -> dict | None:
        """data.json (see `writer.RunWriter`), or None if absent or unreadable."""
        return _data_record(self.path)

    def load_dataset(self, data_dir: str | os.PathLike | None = None):
        """The dataset the run was trained on (see `load_run_dataset`)."""
        return load_run_dataset(self.path, self.config, data_dir)

    def where(self) -> dict:
        """{"checkpoint_step", "checkpoint_epoch"} for an unfinished run, else {}."""
        if self.finished:
            return {}
        return {"checkpoint_step": self.checkpoint_step, "checkpoint_epoch": self.checkpoint_epoch}


def load_run_dataset(
    path: str | os.PathLike,
    cfg: config_lib.Config,
    data_dir: str | os.PathLike | None = None,
    doing: str = "evaluating it there would not measure the same thing",
):
    """The dataset the run at `path` (config `cfg`) was trained on: from `data_dir`, else
    where training read it (data.json) if it is still there, else where
    `data.load_dataset` looks for `cfg`. DataError when the files found have other
    checksums than the ones it was trained on (`doing`: why that matters, in words)."""
    spec, recorded = get_spec(cfg.data.dataset), _data_record(Path(path))
    dataset = load_dataset(
        spec,
        data_dir or _recorded_folder(recorded, spec) or cfg.data.data_dir,
        download=cfg.data.download,
    )
    trained_on = (recorded or {}).get("sha256")
    if isinstance(trained_on, dict) and trained_on != {
        f.name: f.sha256 for f in dataset.spec.files
    }:
        raise DataError(
            f"{path}: trained on {recorded.get('dataset')} data with other "
            f"checksums than {dataset.source} has; {doing}"
        )
    return dataset


def read_config(path: str | os.PathLike) -> config_lib.Config:
    """A run directory's config.json as a `Config` (NotARunError, CorruptRunError)."""
    path = Path(path)
    if not path.is_dir():
        raise NotARunError(f"{path}: no such run directory")
    raw = _read_json(path / rundir.CONFIG_FILE, "not a run directory")
    try:
        return config_lib.from_dict(raw)
    except Exception as e:  # noqa: BLE001 -- a hand-edited or foreign config.json
        raise CorruptRunError(f"{path / rundir.CONFIG_FILE}: not a jaxmnist config ({e})") from None


def open_run(path: str | os.PathLike) -> Run:
    """The run directory at `path`, parameters and all (see the module doc)."""
    path = Path(path)
    cfg = read_config(path)
    spec = get_spec(cfg.data.dataset)
    finished = (path / rundir.SUMMARY_FILE).is_file() and (path / rundir.PARAMS_FILE).is_file()
    if finished:
        params = _stacked_params(path / rundir.PARAMS_FILE, cfg, spec)
        return Run(path, cfg, spec, params, rundir.PARAMS_FILE, True)
    if not checkpoint.checkpoint_steps(path):
        raise NotARunError(
            f"{path}: run has no {rundir.PARAMS_FILE} and no checkpoint (did it finish?)"
        )
    restored = _restore_newest(path, cfg, spec)
    params = jax.device_get(model_params(restored.state))
    source = f"its checkpoint of step {restored.step} (epoch {restored.epoch})"
    return Run(path, cfg, spec, params, source, False, restored.step, restored.epoch)


def _read_json(path: Path, missing: str):
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        if path.name == rundir.CONFIG_FILE:
            raise NotARunError(f"{path.parent}: {missing} (no {path.name})") from None
        raise CorruptRunError(f"{path}: missing ({missing})") from None
    except (ValueError, OSError) as e:
        raise CorruptRunError(f"{path}: cannot read ({e})") from None


def _member_shapes(cfg: config_lib.Config, spec: DatasetSpec):
    """One member's TrainState as shapes (nothing allocated)."""
    plan = config_lib.plan_steps(cfg.train, spec.train_size)
    optimizer = optim.make_optimizer(cfg.optimizer, plan.total_steps)
    return jax.eval_shape(
        lambda k: init_state(k, cfg, optimizer, spec.image_shape, spec.num_classes),
        jax.random.key(0),
    )


def _stacked_params(path: Path, cfg: config_lib.Config, spec: DatasetSpec):
    """params.npz, stacked along a member axis (a one-model run saves its model unstacked)."""
    seeds = cfg.train.seeds
    like = _member_shapes(cfg, spec).params
    if seeds > 1:
        like = jax.tree.map(lambda x: jax.ShapeDtypeStruct((seeds, *x.shape), x.dtype), like)
    try:
        params = rundir.load_params(path, like)
    except JaxmnistError as e:
        raise CorruptRunError(str(e)) from None
    return params if seeds > 1 else jax.tree.map(lambda x: np.asarray(x)[None], params)


def _restore_newest(path: Path, cfg: config_lib.Config, spec: DatasetSpec):
    device = jax.sharding.SingleDeviceSharding(parallel.default_device())
    target = checkpoint.abstract_state(_member_shapes(cfg, spec), cfg.train.seeds, device)
    try:
        return checkpoint.restore_newest(path, target)
    except JaxmnistError as e:  # every checkpoint damaged
        raise CorruptRunError(str(e)) from None


def _data_record(path: Path) -> dict | None:
    try:
        record = json.loads((path / rundir.DATA_FILE).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def _recorded_folder(recorded: dict | None, spec: DatasetSpec):
    """The folder training read its data from (data.json), if it still has the data."""
    if not recorded or recorded.get("dataset") != spec.name or not recorded.get("folder"):
        return None
    folder = Path(recorded["folder"])
    return folder if scan(spec, folder).usable else None
