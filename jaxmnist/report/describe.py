"""A run in words: formatted numbers and the summary rows shared by reports and comparisons.

`summary_rows(run)` is the run's summary table: what was trained (dataset, model in its
family's own words, optimizer, duration), how well (test and train accuracy and loss), how fast
(compile, training, evaluation time and throughput, compile kept apart), where
(backend, device, host, versions) and how to run it again (the command). Each
row also carries the number a comparison ranks, when there is one.
"""

from __future__ import annotations

import json
import math

from jaxmnist import config as config_lib
from jaxmnist.data import DATASETS
from jaxmnist.errors import ConfigError
from jaxmnist.models import MODELS, get_model
from jaxmnist.report.rundata import RunData

DASH = "—"


def _missing(x) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def pct(x, digits: int = 2) -> str:
    """A fraction as a percentage: 0.9677 -> "96.77%"; None or NaN -> a dash."""
    return DASH if _missing(x) else f"{100 * x:.{digits}f}%"


def num(x, fmt: str = ",.4f") -> str:
    return DASH if _missing(x) else format(x, fmt)


def secs(x) -> str:
    return DASH if _missing(x) else f"{x:.3f} s" if x < 10 else f"{x:.1f} s"


# What a process that trained a run tells the child process drawing its report
# (`background`), so that the child needs neither JAX nor the families registered at run
# time: `model_facts` of model sections (keyed by `model_key`). Datasets registered at
# run time it puts in the child's registry.
MODEL_FACTS: dict[str, dict] = {}


def dataset_title(name: str) -> str:
    """ "mnist" -> "MNIST"; a dataset jaxmnist does not know keeps its name."""
    spec = DATASETS.get(name)
    return spec.display_name if spec is not None else str(name)


def flatten(cfg: dict, prefix: str = "") -> dict[str, object]:
    """A nested config dict as {"section.field": value}."""
    out = {}
    for k, v in cfg.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def model_key(m: dict) -> str:
    """`MODEL_FACTS`'s key for the model section `m`."""
    return json.dumps(m, sort_keys=True, default=str)


def model_facts(m: dict) -> dict:
    """{"network": e.g. "mlp in → 256 → out", "first_kernel": its `Model.first_kernel`}
    for the run's model section `m`: the family's `describe` and first-layer kernel key
    (which load its module, and JAX), or what a parent process told (`MODEL_FACTS`). A
    family not registered here (or a section this version cannot read) is described by
    its name and `hidden` sizes."""
    if (told := MODEL_FACTS.get(model_key(m))) is not None:
        return told
    name = m.get("name")
    try:
        model_cfg = config_lib.from_dict({"model": m}).model
        network = get_model(model_cfg.name).describe(model_cfg)
    except ConfigError:
        network = f"{name} " + " → ".join(map(str, ["in", *(m.get("hidden") or []), "out"]))
    kernel = MODELS[name].first_kernel if isinstance(name, str) and name in MODELS else None
    return {"network": network, "first_kernel": kernel}


def model_text(m: dict) -> str:
    """e.g. "mlp in → 256 → out, relu, compute float32": `model_facts`'s network, then
    the common fields."""
    return f"{model_facts(m)['network']}, {m.get('activation')}, compute {m.get('dtype')}"


def optimizer_text(o: dict, total_steps) -> str:
    """e.g. "adamw, lr 0.003, warmup_cosine schedule over 400 steps, weight decay 0.0001"."""
    lr = o.get("lr")
    parts = [f"{o.get('name')}, lr {lr:g}" if isinstance(lr, (int, float)) else str(o.get("name"))]
    schedule = o.get("schedule", "constant")
    over = f" over {total_steps:,} steps" if schedule != "constant" and total_steps else ""
    parts.append(f"{schedule} schedule{over}")
    if o.get("warmup_steps"):
        parts.append(f"{o['warmup_steps']} warmup steps")
    if o.get("weight_decay"):
        parts.append(f"weight decay {o['weight_decay']:g}")
    if o.get("name") == "sgd" and o.get("momentum") is not None:
        parts.append(f"momentum {o['momentum']:g}")
    if o.get("grad_clip"):
        parts.append(f"clip global norm {o['grad_clip']:g}")
    return ", ".join(parts)


def duration_text(records: list[dict], steps: int) -> str:
    """e.g. "2 epochs × 468 steps = 936 steps", or with a partial last epoch
    "3 epochs (10 steps each, the last 5) = 25 steps"."""
    per_epoch = [b["step"] - a for a, b in zip([0] + [r["step"] for r in records], records)]
    n = len(per_epoch)
    if len(set(per_epoch)) == 1:
        return f"{n} epoch{'s' * (n != 1)} × {per_epoch[0]:,} steps = {steps:,} steps"
    return f"{n} epochs ({per_epoch[0]:,} steps each, the last {per_epoch[-1]:,}) = {steps:,} steps"


def summary_rows(run: RunData) -> list[tuple[str, str, float | None]]:
    """(label, text, number or None) rows describing `run`. The number is what a
    comparison ranks; `compare.HIGHER_IS_BETTER` says which way."""
    c, s, e = run.config, run.summary, run.environment
    m, t = c.get("model", {}), c.get("train", {})
    dataset = dataset_title(s.get("dataset", c.get("data", {}).get("dataset")))
    train_note = (
        f"train subset of {s['train_eval_examples']:,}, seed {s['train_eval_subset_seed']}"
        if "train_eval_subset_seed" in s
        else "full training set"
        if t.get("eval_train", True)
        else "running batch accuracy"
    )
    versions = ", ".join(
        f"{k} {e[k]}" for k in ("jaxmnist", "jax", "jaxlib", "optax", "numpy", "python") if e.get(k)
    )
    devices = ", ".join(e.get("devices") or []) or e.get("device", DASH)

    def timed(label: str, key: str):
        return (label, secs(s.get(key)), s.get(key))

    return [
        ("Dataset", f"{dataset} ({s.get('num_test_examples', 0):,} test examples)", None),
        ("Data source", e.get("source", DASH), None),
        ("Model", model_text(m), None),
        ("Parameters", f"{s.get('num_params', 0):,}", s.get("num_params")),
        ("Optimizer", optimizer_text(c.get("optimizer", {}), s.get("steps")), None),
        ("Batch size", str(t.get("batch_size", DASH)), None),
        ("Epochs and steps", duration_text(run.records, s.get("steps", 0)), None),
        ("Seed", str(t.get("seed", DASH)), None),
        ("Test accuracy", pct(s.get("test_accuracy")), s.get("test_accuracy")),
        ("Test loss", num(s.get("test_loss")), s.get("test_loss")),
        (
            "Train accuracy",
            f"{pct(s.get('train_accuracy'))} ({train_note})",
            s.get("train_accuracy"),
        ),
        (
            "Train loss",
            f"{num(s.get('train_loss'))} (mean over the last epoch)",
            s.get("train_loss"),
        ),
        timed("Compile time", "compile_seconds"),
        timed("Training time", "train_seconds"),
        timed("Steady epoch time", "steady_epoch_seconds"),
        timed("Evaluation time", "eval_seconds"),
        timed("Wall time", "wall_seconds"),
        (
            "Examples/s",
            f"{num(s.get('examples_per_second'), ',.0f')} (training, compile excluded)",
            s.get("examples_per_second"),
        ),
        (
            "Backend and device",
            f"{e.get('backend', DASH)}: {devices} ({e.get('device_kind', DASH)})",
            None,
        ),
        (
            "Host",
            (
                f"{e.get('cpu_model', DASH)}, {e.get('cpu_count', DASH)} CPUs; "
                f"{e.get('platform', DASH)}"
            ),
            None,
        ),
        ("Versions", versions or DASH, None),
        ("Command", run.command or "not recorded (not run from the command line)", None),
    ]
