"""`jaxmnist export`: the file runs where jaxmnist is not, and predicts what `jaxmnist eval` counts.

The exported file is loaded by the docs' loader (docs/using-a-model.md) in a fresh Python process in
which importing jaxmnist fails, and run at batch sizes 1, 7 and 10,000 on the
test set; its predictions must give `jaxmnist eval`'s confusion matrix exactly.
"""

import dataclasses
import json
import os
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

from jaxmnist.cli import main
from jaxmnist.models import apply_uint8
from jaxmnist.runs.reader import open_run
from jaxmnist.use import export

# The docs' loader (docs/using-a-model.md), then batch sizes 1, 7 and 10,000 over the images
# in argv[2].
LOADER = textwrap.dedent(
    """
    import sys
    sys.modules["jaxmnist"] = None  # any import of jaxmnist now fails

    import json
    import jax
    import numpy as np

    with open(sys.argv[1], "rb") as f:
        header = json.loads(f.readline())
        model = jax.export.deserialize(bytearray(f.read()))
    predict = jax.jit(model.call)  # compiles once per batch size
    images = np.load(sys.argv[2])
    out = {}
    for batch in (1, 7, 10_000):
        tiled = np.resize(images, (max(len(images), batch), *images.shape[1:]))
        probs = [np.asarray(predict(tiled[i : i + batch])) for i in range(0, len(tiled), batch)]
        out[batch] = np.concatenate(probs)
        assert out[batch].shape == (len(tiled), len(header["class_names"]))
    np.savez(sys.argv[3], **{str(k): v.argmax(-1) for k, v in out.items()})
    assert not [m for m, mod in sys.modules.items() if m.startswith("jaxmnist") and mod]
    print(json.dumps(header))
    """
)


def run_loader(model_file, images, tmp_path):
    np.save(tmp_path / "images.npy", images)
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            LOADER,
            str(model_file),
            str(tmp_path / "images.npy"),
            str(tmp_path / "out.npz"),
        ],
        check=False,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    with np.load(tmp_path / "out.npz") as f:
        return json.loads(done.stdout), {int(k): f[k] for k in f.files}


def confusion(labels, predicted, num_classes=10):
    out = np.zeros((num_classes, num_classes), np.int64)
    np.add.at(out, (labels, predicted), 1)
    return out


def check_matches_eval(run, images, labels, tmp_path, capsys, *member):
    """Exports `run` (its `--member I` where given) and checks the file's answers at each
    batch size against `jaxmnist eval`'s confusion matrix; (header, eval's JSON)."""
    model_file = tmp_path / "model.jaxexport"
    assert main(["export", str(run), "--out", str(model_file), *member]) == 0
    capsys.readouterr()
    assert main(["eval", str(run), "--json", *member]) == 0
    evaluated = json.loads(capsys.readouterr().out)
    header, predicted = run_loader(model_file, images, tmp_path)
    n = len(labels)
    for batch in (1, 7, 10_000):
        np.testing.assert_array_equal(
            confusion(labels, predicted[batch][:n]), evaluated["confusion_matrix"]
        )
        # Past n the 10,000 batch repeats the set: the same image, the same answer.
        np.testing.assert_array_equal(
            predicted[batch], np.resize(predicted[1][:n], len(predicted[batch]))
        )
    return header, evaluated


@pytest.mark.parametrize(
    "run, member",
    [
        # In the accelerator lane the MLP's round trip: on a TPU v5e a CNN's training
        # program compiled for more than a minute at the highest matmul precision.
        pytest.param("tiny_cli_run", [], id="mlp", marks=pytest.mark.accelerator),
        pytest.param("tiny_cnn_run", ["--member", "1"], id="cnn-batch-norm"),
    ],
)
def test_export_runs_without_jaxmnist_and_matches_eval(
    run, member, tiny_registered, tiny_arrays, tmp_path, capsys, request
):
    """A one-model run, and one member of a run of two CNNs with batch norm (one model too:
    its running statistics exported with it)."""
    run = request.getfixturevalue(run)
    header, evaluated = check_matches_eval(
        run, tiny_arrays["test_images"], tiny_arrays["test_labels"], tmp_path, capsys, *member
    )
    summary = json.loads((run / "summary.json").read_text())
    accuracy = summary["test_accuracy_per_seed"][1] if member else summary["test_accuracy"]
    assert header["format"] == export.FORMAT and "ensemble" not in header["output_meaning"]
    assert header["class_names"] == evaluated["class_names"]
    assert header["input"]["shape"] == ["batch", 28, 28] and header["input"]["dtype"] == "uint8"
    assert header["test_accuracy"] == accuracy == evaluated["test_accuracy"]
    assert header["jax_version"] and header["platforms"] == ["cpu", "cuda", "tpu"]


def test_an_export_predicts_with_the_runs_test_time_augmentation(
    train_argv, tiny_registered, tiny_arrays, tmp_path
):
    """The exported function is the model's inference, `model.tta_shift` included: its
    probabilities are those of the five moved views, not of the image alone."""
    run = tmp_path / "run"
    assert main([*train_argv(run, "--steps", "20", "model.tta_shift=1", "--no-report")]) == 0
    assert main(["export", str(run), "--out", str(tmp_path / "model.jaxexport")]) == 0
    _, exported = export.load_export(tmp_path / "model.jaxexport")
    images = tiny_arrays["test_images"][:50]
    got = np.asarray(exported.call(images))
    saved = open_run(run)
    params, model_cfg = saved.member_params(0), saved.config.model
    want = jax.nn.softmax(apply_uint8(params, images, model_cfg))
    alone = jax.nn.softmax(apply_uint8(params, images, dataclasses.replace(model_cfg, tta_shift=0)))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert not np.allclose(got, alone, rtol=1e-3, atol=1e-4)


@pytest.mark.realdata
@pytest.mark.slow
def test_export_matches_eval_on_the_real_test_set(real_mnist_run, tmp_path, capsys):
    from jaxmnist.data import load_dataset

    test = load_dataset("mnist", download=False)
    assert len(test.test_labels) == 10_000
    check_matches_eval(real_mnist_run, test.test_images, test.test_labels, tmp_path, capsys)


def test_unwritable_destinations_are_refused_in_one_line(tiny_model_run, tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    for out in (tmp_path / "missing" / "m.jaxexport", blocker / "m.jaxexport", tmp_path):
        assert main(["export", str(tiny_model_run), "--out", str(out)]) == 2
    assert (
        main(["export", str(tiny_model_run), "--out", str(tmp_path / "m"), "--platforms", "gpu"])
        == 2
    )
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 4 and all(line.startswith("jaxmnist export: error: ") for line in err), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


def test_a_failed_write_leaves_no_file_and_keeps_the_old_one(
    tiny_model_run, tmp_path, monkeypatch, capsys
):
    out = tmp_path / "model.jaxexport"
    out.write_bytes(b"the previous export")

    def disk_full(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(export.os, "replace", disk_full)
    assert main(["export", str(tiny_model_run), "--out", str(out)]) == 1
    assert "No space left on device" in capsys.readouterr().err
    assert out.read_bytes() == b"the previous export"
    assert [p.name for p in tmp_path.iterdir()] == ["model.jaxexport"]  # no temporary left


@pytest.mark.parametrize("umask", [0o022, 0o002])
def test_the_file_follows_the_umask_as_run_files_do(tiny_model_run, tmp_path, umask, capsys):
    out = tmp_path / "model.jaxexport"
    old = os.umask(umask)
    try:
        assert main(["export", str(tiny_model_run), "--out", str(out), "--platforms", "cpu"]) == 0
    finally:
        os.umask(old)
    assert oct(out.stat().st_mode & 0o777) == oct(0o666 & ~umask)  # not mkstemp's 0600


def test_the_help_names_what_the_file_needs(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "needs only jax and flatbuffers" in " ".join(capsys.readouterr().out.split())


def test_export_help_lists_the_required_out_apart_from_the_options(capsys):
    with pytest.raises(SystemExit):
        main(["export", "--help"])
    out = capsys.readouterr().out
    options, _, required = out.partition("\nrequired:\n")
    assert "--out FILE" in required and "--out" not in options.split("options:")[1]
