"""`jaxmnist eval RUN_DIR`: re-evaluate a run's saved parameters on its test set.

Prints accuracy, loss and the confusion matrix with the dataset's class names in full
(per seed for a run of several, with the ensemble of its members: the confusion matrix
is the ensemble's; --member I evaluates one member), or the result as JSON.
"""

from __future__ import annotations

import argparse
import json

from jaxmnist.use.members import add_member_option


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("eval", help="re-evaluate a run's saved parameters")
    p.add_argument("run_dir", metavar="RUN_DIR")
    p.add_argument("--data-dir", help="folder holding <dataset>/...")
    p.add_argument(
        "--json",
        action="store_true",
        help="print the results as one JSON object; its train_loss (and train_set_loss) is "
        "the loss over the training set (its train_set says which: the full set, or the "
        "fixed subset the run evaluated after each epoch), not summary.json's train_loss "
        "(the last epoch's mean batch loss while training)",
    )
    p.add_argument(
        "--tta-shift",
        type=int,
        metavar="N",
        help="test-time augmentation: each image's prediction is the mean of the "
        "probabilities over it and its four moves by N pixels (0: none; default: the "
        "run's model.tta_shift)",
    )
    add_member_option(p)
    return p


def run(args: argparse.Namespace) -> int:
    from jaxmnist.use.reevaluate import evaluate_run  # start-up: imports jax

    result = evaluate_run(
        args.run_dir,
        data_dir=args.data_dir,
        member=args.member,
        memory_budget_mb=args.memory_budget_mb,
        tta_shift=args.tta_shift,
    )
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_eval(result)
        if "checkpoint_step" in result:
            print(
                f"evaluated the newest checkpoint of an unfinished run: step "
                f"{result['checkpoint_step']} (epoch {result['checkpoint_epoch']})"
            )
    return 0


def print_eval(result: dict) -> None:
    print(f"run          {result['run_dir']}")
    print(f"dataset      {result['dataset']}")
    if result.get("tta_shift"):
        n = result["tta_shift"]
        print(f"predictions  the mean over each image and its four moves by {n} pixel(s)")
    if "seeds" in result:
        from jaxmnist import stats  # start-up: numpy, which `eval --help` need not wait for

        spread = stats.spread(result["test_accuracy_per_seed"])
        print(f"seeds        {len(result['seeds'])}: test accuracy {stats.format_spread(spread)}")
        for seed, acc, loss in zip(
            result["seeds"], result["test_accuracy_per_seed"], result["test_loss_per_seed"]
        ):
            print(f"  seed {seed:<6} accuracy {acc:.2%}  loss {loss:.4f}")
        print(
            f"ensemble     accuracy {result['ensemble_test_accuracy']:.2%}  "
            f"loss {result['ensemble_test_loss']:.4f}  "
            f"(the mean of the {result['ensemble_members']} members' probabilities)"
        )
        if "ensemble_val_accuracy" in result:
            print(
                f"  on val     accuracy {result['ensemble_val_accuracy']:.2%}  "
                f"loss {result['ensemble_val_loss']:.4f}"
            )
        print("(below: means over the seeds; the confusion matrix is the ensemble's)")
    elif "member" in result:
        print(
            f"member       {result['member']} (seed {result['seed']}) of {result['seeds_in_run']}"
        )
    print(
        f"test         accuracy {result['test_accuracy']:.2%}  loss {result['test_loss']:.4f}  "
        f"({result['num_test_examples']:,} examples)"
    )
    if "val_accuracy" in result:
        print(
            f"val          accuracy {result['val_accuracy']:.2%}  loss {result['val_loss']:.4f}  "
            f"({result['num_val_examples']:,} held-out training examples, "
            f"seed {result['validation_seed']})"
        )
    if result.get("train_accuracy") is not None:
        print(
            f"train        accuracy {result['train_accuracy']:.2%}  "
            f"loss {result['train_loss']:.4f}  "
            + (
                f"({result['train_set']}, seed {result['train_eval_subset_seed']})"
                if "train_eval_subset_seed" in result
                else f"({result['num_train_examples']:,} examples)"
            )
        )
    print("confusion matrix (test):")
    print(format_confusion(result["confusion_matrix"], result["class_names"]))


def format_confusion(matrix, class_names) -> str:
    """Counts, rows = true class, columns = predicted class; class names in full."""
    names = list(class_names)
    width = max(6, *(len(n) for n in names)) + 1
    lines = ["true \\ pred".ljust(width + 2) + "".join(n.rjust(width) for n in names)]
    for name, row in zip(names, matrix):
        lines.append(name.ljust(width + 2) + "".join(str(int(v)).rjust(width) for v in row))
    return "\n".join(lines)
