"""Configuration: frozen dataclasses, named presets, and type-checked overrides.

A `Config` is the whole description of a run. Presets start from the default and
replace a few fields. Overrides arrive as dotted `section.field=value` strings
(`optimizer.lr=3e-3`), are parsed against the field's declared type, and an
unknown key or a badly typed value is a `ConfigError`. `validate` checks what
can be checked before any data is read or anything is compiled. Durations
(epochs or steps) become a step count in exactly one place: `plan_steps`.

`Config.model` is the config dataclass of whichever model family `model.name` names
(`jaxmnist.models`: each family declares its own fields; this module holds none). The
`model.*` keys are that family's fields: `model.name` is applied before the others, so
`model.name=cnn model.kernel_size=5` works in either order; switching family keeps the
fields both families declare and takes the new family's defaults for the rest; a field
the family does not have is a `ConfigError` naming its fields. Reading a saved config
(`from_dict`) drops the model fields that belong to another registered family (a
config.json of older versions holds every family's fields), and refuses anything else.

Reading presets and overrides imports no jax (the command line's `--help` reads the
presets); `validate` does, through the model family (the mesh's syntax, `jaxmnist.mesh`,
needs none).
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field, replace

from jaxmnist.data.registry import get_spec
from jaxmnist.errors import ConfigError
from jaxmnist.mesh import parse_devices, parse_mesh
from jaxmnist.models import (
    MODELS,
    CNNConfig,
    MLPConfig,
    ModelConfig,
    config_fields,
    get_model,
    switch_family,
    unknown_field_message,
)
from jaxmnist.models.family import validate_common

OPTIMIZERS = ("sgd", "adam", "adamw")
TARGET_SPLITS = ("test", "val")
SCHEDULES = ("constant", "cosine", "warmup_cosine", "onecycle")
# jax.random.key keeps only a seed's low 32 bits (as uint32) when 64-bit types are off, as
# they are here: 2**32 + 1 and -2**32 + 1 give seed 1's key, and a seed outside int64
# overflows. Seeds 0 ... 2**32 - 1 are the ones that give distinct random streams.
MAX_SEED = 2**32 - 1


@dataclass(frozen=True)
class DataConfig:
    dataset: str = "mnist"  # a dataset of the registry (jaxmnist.data.DATASETS)
    data_dir: str | None = None  # None: $JAXMNIST_DATA_DIR, cache, system folder, download
    download: bool = True  # fetch the dataset from its mirrors when no folder has it
    augment: bool = False  # random moves of each training image, on the device (data.augment)
    max_shift: int = 2  # augment: pixels of random translation, each way
    max_rotation: float = 0.0  # augment: degrees of random rotation, each way; 0: none
    max_scale: float = 0.0  # augment: random zoom, a factor within 1 ± this; 0: none
    max_shear: float = 0.0  # augment: degrees of random horizontal shear, each way
    flip: bool = False  # augment: mirror half the images left-right (clothes, not digits)
    erase: float = 0.0  # augment: probability of a random rectangle of noise (random erasing)
    elastic_alpha: float = 0.0  # augment: elastic distortion's strength (Simard's alpha); 0: none
    elastic_sigma: float = 4.0  # augment: its smoothness, the Gaussian's sigma in pixels
    # Training examples held out as the validation split (stratified, drawn from a fixed
    # seed: training.validation); never trained on. 0: none
    validation: int = 0


@dataclass(frozen=True)
class OptimizerConfig:
    name: str = "adam"  # the optimizer (optim.make_optimizer)
    lr: float = 1e-3  # the learning rate; a schedule's peak
    weight_decay: float = 0.0  # adamw: decoupled; sgd: added to the gradient; adam: unused
    momentum: float = 0.9  # sgd only
    b1: float = 0.9  # adam, adamw: decay of the gradient's running mean
    b2: float = 0.999  # adam, adamw: decay of its running square
    schedule: str = "constant"  # the learning rate over the steps (optim)
    warmup_steps: int = 0  # warmup_cosine only
    grad_clip: float | None = None  # global-norm clipping; None: off


@dataclass(frozen=True)
class TrainConfig:
    batch_size: int = 128  # training examples per step (per model, over all devices)
    epochs: int = 5  # passes over the training set
    steps: int | None = None  # if set, overrides epochs; the last epoch may be partial
    seed: int = 0  # the first model's seed: its initialisation, data order and augmentation
    seeds: int = 1  # models trained together in one program, seeds seed ... seed+seeds-1
    target_accuracy: float | None = (
        None  # stop after the first epoch whose (mean) test accuracy reaches it
    )
    target_split: str = "test"  # the split target_accuracy watches: test, or val (data.validation)
    eval_batch_size: int = 2000  # examples per evaluation call (the last batch padded, masked)
    eval_train: bool = True  # evaluate on the training set every epoch; false: batch accuracy
    # eval_train on a fixed subset of this many training examples (stratified, the same
    # every epoch: training.evaluate.subset_indices); None, or >= the set's size: all of it
    eval_train_examples: int | None = None
    progress_every: int = 0  # calls end at least every this many steps (bar updates); 0: by time
    label_smoothing: float = 0.0  # training loss against smoothed one-hot targets; 0: none
    # An exponential moving average of the parameters (and batch norm's statistics) kept
    # while training, with this decay: evaluation and the saved model use it; 0: none
    ema_decay: float = 0.0


@dataclass(frozen=True)
class ParallelConfig:
    """Where the run's arithmetic happens; never what it computes (resuming may change it)."""

    devices: str | None = None  # a count or "all"; None: 1, or as many as `mesh` names
    mesh: str | None = None  # "members=M,data=D"; None: picked from devices and the model count


@dataclass(frozen=True)
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=MLPConfig)  # the family's own dataclass
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    compile_cache: bool = True  # JAX's persistent compilation cache, in the jaxmnist cache
    tensorboard: bool = False  # TensorBoard event files in <run dir>/tensorboard/
    memory_budget_mb: int | None = None  # device memory many models may use; None: ask the device

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def from_dict(d: dict) -> Config:
    """Rebuilds a Config from `to_dict` output (e.g. a run's config.json).

    In the model section, a field the chosen family lacks is dropped when it is a field
    of another registered family (older versions saved every family's fields in one
    flat section, e.g. an MLP's with `channels`); any other unknown key is an error."""
    overrides = {}
    for section, value in d.items():
        if isinstance(value, dict):
            if section == "model":
                value = _own_model_fields(value)
            overrides.update({f"{section}.{k}": v for k, v in value.items()})
        else:
            overrides[section] = value
    return apply_overrides(Config(), overrides)


def _own_model_fields(section: dict) -> dict:
    """`section` without the fields of families other than the one it names."""
    name = section.get("name", Config().model.name)
    if not isinstance(name, str) or name not in MODELS:
        return section  # apply_overrides says what is wrong with it
    own = config_fields(name)
    others = {f for other in MODELS for f in config_fields(other)}
    return {k: v for k, v in section.items() if k in own or k not in others}


# The CNN presets evaluate the training set on a fixed subset of this many examples (the
# test set still in full), sized by benchmarks/eval_overhead.py so that evaluating after
# every epoch costs at most about 5% of training time; `cnn`, whose epoch is the fastest
# beside its evaluation, half as many. speedrun's test set alone takes about that much,
# so it evaluates no training set (train accuracy: the batches'); tpu101 keeps the full
# set, as the tutorial does.
CNN_EVAL_TRAIN_EXAMPLES = 1000
# ... and in batches of this many examples: as fast as larger ones per example, with a
# quarter of the working memory, and the steps program stays the largest, which the
# memory estimate is calibrated on (250 evaluates faster, but then the estimate falls
# below the measured peak: benchmarks/eval_overhead.py, memory_estimate.py).
CNN_EVAL_BATCH_SIZE = 500


def _cnn_training(**fields) -> TrainConfig:
    """The CNN presets' training: batches of 256, and evaluation as above."""
    defaults = {
        "batch_size": 256,
        "eval_batch_size": CNN_EVAL_BATCH_SIZE,
        "eval_train_examples": CNN_EVAL_TRAIN_EXAMPLES,
    }
    return TrainConfig(**(defaults | fields))


def _record_cnn() -> CNNConfig:
    """The record presets' network: two VGG blocks (conv 3x3 64, conv 3x3 64, pool; conv
    3x3 128, conv 3x3 128, pool), batch norm after each conv, dense 256 with dropout 0.3,
    bfloat16 arithmetic (float32 parameters)."""
    return CNNConfig(
        channels=(64, 64, 128, 128),
        pool=(0, 1, 0, 1),
        kernel_size=(3,),
        hidden=(256,),
        dropout=0.3,
        batch_norm=True,
        dtype="bfloat16",
    )


PRESETS: dict[str, Config] = {
    # The TPU 101 tutorial: MNIST, 784-256-10 ReLU, Adam 1e-3, batch 128, 5 epochs.
    "tpu101": Config(),
    # The GPU codelab: Fashion-MNIST, 784-256-128-10 GELU, AdamW 3e-3 wd 1e-4,
    # batch 512, 400 steps.
    "codelab": Config(
        data=DataConfig(dataset="fashion_mnist"),
        model=MLPConfig(hidden=(256, 128), activation="gelu"),
        optimizer=OptimizerConfig(name="adamw", lr=3e-3, weight_decay=1e-4),
        train=TrainConfig(batch_size=512, steps=400),
    ),
    # MNIST CNN: conv 3x3 16, pool; conv 3x3 32, pool; dense 128 (206,922 parameters);
    # translations of up to 2 pixels; Adam one-cycle 3e-3, batch 256, 10 epochs.
    "cnn": Config(
        data=DataConfig(augment=True, max_shift=2),
        model=CNNConfig(channels=(16, 32), kernel_size=(3,), hidden=(128,)),
        optimizer=OptimizerConfig(name="adam", lr=3e-3, schedule="onecycle"),
        train=_cnn_training(epochs=10, eval_train_examples=CNN_EVAL_TRAIN_EXAMPLES // 2),
    ),
    # Fashion-MNIST CNN: the MNIST CNN's network (206,922 parameters), translations of up
    # to 1 pixel and left-right flips; Adam one-cycle 3e-3, batch 256, 20 epochs (the trials
    # that chose it over wider networks and dropout: docs/results.md, "The CNN presets over
    # 8 seeds").
    "fashion_cnn": Config(
        data=DataConfig(dataset="fashion_mnist", augment=True, max_shift=1, flip=True),
        model=CNNConfig(channels=(16, 32), kernel_size=(3,), hidden=(128,)),
        optimizer=OptimizerConfig(name="adam", lr=3e-3, schedule="onecycle"),
        train=_cnn_training(epochs=20),
    ),
    # Least time to 99.0% on MNIST, in one epoch: the network and optimizer of a published
    # one-epoch MNIST recipe (github.com/tuomaso/train_mnist_fast): conv 5x5 1->24 and 3x3
    # 24->32, both unpadded, each pooled; dense 800->256->10 (215,194 parameters); Adam
    # with b1 0.7, b2 0.9, one-cycle peak 1e-2; batch 256. Ours adds 1-pixel translations,
    # which earned their keep over 8 seeds (docs/results.md, "The CNN presets over 8 seeds").
    "speedrun": Config(
        data=DataConfig(augment=True, max_shift=1),
        model=CNNConfig(channels=(24, 32), kernel_size=(5, 3), padding="valid", hidden=(256,)),
        optimizer=OptimizerConfig(name="adam", lr=1e-2, b1=0.7, b2=0.9, schedule="onecycle"),
        train=_cnn_training(
            epochs=1, target_accuracy=0.99, eval_train=False, eval_train_examples=None
        ),
    ),
    # The record presets: the best ensembles one TPU chip trains in a few minutes (and a
    # CPU in hours): 8 members of `_record_cnn` trained in one program, evaluated as the
    # mean of their probabilities; Adam one-cycle 3e-3, batch 256. MNIST: random affine
    # warps (±2 px, ±10°, scale ±10%, shear ±10°), 60 epochs, evaluated with the moving
    # average of the parameters (decay 0.999). Chosen on a validation split, not on the
    # test set (docs/training.md, "Presets").
    "record": Config(
        data=DataConfig(
            augment=True, max_shift=2, max_rotation=10.0, max_scale=0.1, max_shear=10.0
        ),
        model=_record_cnn(),
        optimizer=OptimizerConfig(name="adam", lr=3e-3, schedule="onecycle"),
        train=_cnn_training(epochs=60, seeds=8, ema_decay=0.999),
    ),
    # Its Fashion-MNIST counterpart: the same network; ±2 px translations, left-right flips
    # and random erasing (affine warps did worse on the validation split), 40 epochs.
    "fashion_record": Config(
        data=DataConfig(dataset="fashion_mnist", augment=True, max_shift=2, flip=True, erase=0.5),
        model=_record_cnn(),
        optimizer=OptimizerConfig(name="adam", lr=3e-3, schedule="onecycle"),
        train=_cnn_training(epochs=40, seeds=8),
    ),
}


def get_preset(name: str) -> Config:
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}; choose from: {', '.join(PRESETS)}")
    return PRESETS[name]


def _parse_value(text: str, typ, key: str):
    """Parses `text` as `typ` (int, float, bool, str, tuple[int, ...], X | None)."""
    origin = typing.get_origin(typ)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(typ) if a is not type(None)]
        if text.lower() in ("none", "null", ""):
            return None
        return _parse_value(text, args[0], key)
    if origin is tuple:
        parts = [p for p in text.replace(",", " ").split() if p]
        if not parts and text.strip():  # "" is the empty tuple (model.hidden: a linear model)
            raise ConfigError(
                f"{key}: {text!r} holds no numbers; to give none, give an empty value ({key}=)"
            )
        return tuple(_parse_value(p, int, key) for p in parts)
    if typ is bool:
        lowered = text.lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"{key}: expected true or false, got {text!r}")
    try:
        if typ is int:
            return int(text)
        if typ is float:
            return float(text)
    except ValueError:
        raise ConfigError(f"{key}: expected {typ.__name__}, got {text!r}") from None
    return text


def _coerce(value, typ, key: str):
    """Checks an already-typed value (from JSON or Python) against `typ`."""
    if isinstance(value, str):
        return _parse_value(value, typ, key)
    origin = typing.get_origin(typ)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return None
        typ = next(a for a in typing.get_args(typ) if a is not type(None))
        origin = typing.get_origin(typ)
    if origin is tuple:
        if isinstance(value, int) and not isinstance(value, bool):
            value = (value,)
        if isinstance(value, (list, tuple)) and all(
            isinstance(v, int) and not isinstance(v, bool) for v in value
        ):
            return tuple(value)
    elif typ is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    elif (
        typ is int
        and isinstance(value, int)
        and not isinstance(value, bool)
        or typ is bool
        and isinstance(value, bool)
    ):
        return value
    raise ConfigError(f"{key}: expected {getattr(typ, '__name__', typ)}, got {value!r}")


def field_names(cfg: Config | None = None) -> list[str]:
    """All overridable keys, dotted (`optimizer.lr`, `compile_cache`, ...); the `model.*`
    keys are those of the family `cfg.model` is."""
    cfg = cfg or Config()
    names = []
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            names += [f"{f.name}.{g.name}" for g in dataclasses.fields(value)]
        else:
            names.append(f.name)
    return names


def apply_overrides(cfg: Config, overrides: dict[str, object]) -> Config:
    """Returns `cfg` with dotted keys replaced; values may be strings or typed.

    A duration given here wins over the one in `cfg`: `train.epochs` without
    `train.steps` clears the steps a preset set (codelab's 400), since steps would
    otherwise silently override the epochs asked for. `model.name` goes first: the other
    `model.*` keys are fields of the family it names (`models.switch_family` says what a
    switch keeps).
    """
    if "train.epochs" in overrides and "train.steps" not in overrides:
        overrides = {**overrides, "train.steps": None}
    for key, raw in sorted(overrides.items(), key=lambda item: item[0] != "model.name"):
        parts = key.split(".")
        if key == "model.name":
            name = _coerce(raw, str, key)
            cfg = replace(cfg, model=switch_family(cfg.model, name))
            continue
        if len(parts) == 2 and parts[0] == "model" and key not in field_names(cfg):
            raise ConfigError(unknown_field_message(cfg.model.name, parts[1]))
        if len(parts) > 2 or key not in field_names(cfg):
            raise ConfigError(
                f"unknown config field {key!r}; known fields: {', '.join(field_names(cfg))}"
            )
        hints = typing.get_type_hints(type(cfg))
        if len(parts) == 1:
            cfg = replace(cfg, **{key: _coerce(raw, hints[key], key)})
        else:
            section = getattr(cfg, parts[0])
            sub_hints = typing.get_type_hints(type(section))
            value = _coerce(raw, sub_hints[parts[1]], key)
            cfg = replace(cfg, **{parts[0]: replace(section, **{parts[1]: value})})
    return cfg


def parse_override(text: str) -> tuple[str, str]:
    """Splits `section.field=value`."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise ConfigError(f"override {text!r} is not of the form section.field=value")
    return key.strip(), value.strip()


def _choice(value: str, choices: tuple[str, ...], what: str) -> None:
    if value not in choices:
        raise ConfigError(f"unknown {what} {value!r}; choose from: {', '.join(choices)}")


def validate(cfg: Config, *, num_train_examples: int | None = None) -> None:
    """Raises ConfigError for anything that would fail later; checks no files."""
    spec = get_spec(cfg.data.dataset)
    n_train = num_train_examples or spec.train_size
    model = get_model(cfg.model.name)
    if not isinstance(cfg.model, model.config):  # a bug of the caller, said in one line
        raise ConfigError(
            f"model: a {type(cfg.model).__name__} is not the {cfg.model.name} model's config "
            f"({model.config.__name__}); build it with models.model_config"
        )
    validate_common(cfg.model)  # activation, dtype, dropout
    _choice(cfg.optimizer.name, OPTIMIZERS, "optimizer")
    _choice(cfg.optimizer.schedule, SCHEDULES, "schedule")
    model.validate(cfg.model)  # the family's own fields
    if cfg.data.max_shift < 0:
        raise ConfigError(f"data.max_shift must be >= 0 pixels, got {cfg.data.max_shift}")
    side = min(spec.height, spec.width)
    if cfg.data.max_shift >= side / 2:  # the image would move out of its own frame
        raise ConfigError(
            f"data.max_shift must be smaller than half the image's side: at most "
            f"{(side - 1) // 2} pixels for {spec.name}'s {spec.height}x{spec.width} images, "
            f"got {cfg.data.max_shift}"
        )
    if not 0 <= cfg.data.max_rotation <= 180:
        raise ConfigError(f"data.max_rotation: degrees in [0, 180], got {cfg.data.max_rotation}")
    if not 0 <= cfg.data.max_scale < 1:
        raise ConfigError(f"data.max_scale: a fraction in [0, 1), got {cfg.data.max_scale}")
    if not 0 <= cfg.data.max_shear <= 45:
        raise ConfigError(f"data.max_shear: degrees in [0, 45], got {cfg.data.max_shear}")
    if not 0 <= cfg.data.erase <= 1:
        raise ConfigError(f"data.erase: a probability in [0, 1], got {cfg.data.erase}")
    if not 0 <= cfg.data.elastic_alpha <= 100:
        raise ConfigError(f"data.elastic_alpha: pixels in [0, 100], got {cfg.data.elastic_alpha}")
    if not 0.5 <= cfg.data.elastic_sigma <= side:
        raise ConfigError(
            f"data.elastic_sigma: pixels in [0.5, {side}] for {spec.name}'s images, "
            f"got {cfg.data.elastic_sigma}"
        )
    t, o = cfg.train, cfg.optimizer
    if not 0 <= cfg.data.validation < n_train:
        raise ConfigError(
            f"data.validation: training examples to hold out, from 0 to {n_train - 1} "
            f"(the training set has {n_train}), got {cfg.data.validation}"
        )
    n_train -= cfg.data.validation  # the examples trained on
    held_out = f" less the {cfg.data.validation} held out" if cfg.data.validation else ""
    if not 0 < t.batch_size <= n_train:
        raise ConfigError(
            f"batch size must be between 1 and the training set size ({n_train}{held_out}), "
            f"got {t.batch_size}"
        )
    if t.epochs <= 0:
        raise ConfigError(f"epochs must be positive, got {t.epochs}")
    if t.steps is not None and t.steps <= 0:
        raise ConfigError(f"steps must be positive, got {t.steps}")
    if t.eval_batch_size <= 0:
        raise ConfigError(f"eval batch size must be positive, got {t.eval_batch_size}")
    if t.eval_train_examples is not None and t.eval_train_examples <= 0:
        raise ConfigError(
            "train.eval_train_examples must be a positive number of training examples "
            f"(or none for the full training set), got {t.eval_train_examples}"
        )
    if t.seeds <= 0:
        raise ConfigError(f"seeds must be a positive number of models, got {t.seeds}")
    if not 0 <= t.seed <= t.seed + t.seeds - 1 <= MAX_SEED:
        last = f" to {t.seed + t.seeds - 1} (--seed {t.seed} --seeds {t.seeds})" * (t.seeds > 1)
        raise ConfigError(
            f"seeds must lie in 0..{MAX_SEED}, got {t.seed}{last}: JAX's random keys keep "
            "a seed's low 32 bits, so any other seed would repeat one of those"
        )
    if t.target_accuracy is not None and not 0 < t.target_accuracy <= 1:
        raise ConfigError(
            f"target accuracy is a fraction in (0, 1], e.g. 0.973; got {t.target_accuracy:g}"
        )
    _choice(t.target_split, TARGET_SPLITS, "target split")
    if t.target_split == "val" and not cfg.data.validation:
        raise ConfigError(
            "--target-split val watches the validation split, and there is none: hold out "
            "examples with data.validation=N"
        )
    # Syntax only here; the devices are checked by training.parallel.layout_for.
    parse_devices(cfg.parallel.devices)
    parse_mesh(cfg.parallel.mesh)
    if cfg.memory_budget_mb is not None and cfg.memory_budget_mb <= 0:
        raise ConfigError(f"memory_budget_mb must be positive, got {cfg.memory_budget_mb}")
    if t.progress_every < 0:
        raise ConfigError(f"progress_every must be >= 0, got {t.progress_every}")
    for name in ("label_smoothing", "ema_decay"):  # fractions: 0 is off, 1 would be nothing left
        if not 0 <= getattr(t, name) < 1:
            raise ConfigError(f"train.{name} must be in [0, 1), got {getattr(t, name)}")
    if not (math.isfinite(o.lr) and o.lr > 0):
        raise ConfigError(f"learning rate must be finite and positive, got {o.lr}")
    if not (math.isfinite(o.weight_decay) and o.weight_decay >= 0):
        raise ConfigError(f"weight decay must be finite and >= 0, got {o.weight_decay}")
    if not 0 <= o.momentum < 1:
        raise ConfigError(f"momentum must be in [0, 1), got {o.momentum}")
    for name in ("b1", "b2"):
        if not 0 <= getattr(o, name) < 1:
            raise ConfigError(f"optimizer.{name} must be in [0, 1), got {getattr(o, name)}")
    if o.warmup_steps < 0:
        raise ConfigError(f"warmup_steps must be >= 0, got {o.warmup_steps}")
    if o.warmup_steps and o.schedule != "warmup_cosine":
        raise ConfigError(
            f"warmup_steps={o.warmup_steps} has no effect with schedule {o.schedule!r}: "
            "warmup applies to warmup_cosine only (use --schedule warmup_cosine, or drop it)"
        )
    if o.grad_clip is not None and not (math.isfinite(o.grad_clip) and o.grad_clip > 0):
        raise ConfigError(f"grad_clip must be finite and positive, got {o.grad_clip}")
    if o.weight_decay and o.name == "adam":
        raise ConfigError("optimizer adam has no weight decay; use adamw (decoupled) or sgd")


@dataclass(frozen=True)
class StepPlan:
    """How a run's duration splits into compiled epochs."""

    steps_per_epoch: int  # full epoch: the last partial batch is dropped
    epoch_steps: tuple[int, ...]  # steps in each epoch; only the last may be shorter

    @property
    def total_steps(self) -> int:
        return sum(self.epoch_steps)


def plan_steps(train: TrainConfig, num_train_examples: int) -> StepPlan:
    """The one place where epochs or steps become a step count."""
    per_epoch = num_train_examples // train.batch_size
    total = train.steps if train.steps is not None else train.epochs * per_epoch
    full, rest = divmod(total, per_epoch)
    return StepPlan(per_epoch, (per_epoch,) * full + ((rest,) if rest else ()))
