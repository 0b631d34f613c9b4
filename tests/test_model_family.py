"""A model family owns its config: a family registered here, with a field of its own, is
trained, evaluated, exported and served through the real CLI without editing any other
module; and the `model.*` overrides read the chosen family's fields (switching family in
either order, refusing another family's fields, reading old config.json files).
"""

import json
import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
import pytest

TestClient = pytest.importorskip("starlette.testclient", reason="needs the serve extra").TestClient

from jaxmnist import config as config_lib
from jaxmnist import models
from jaxmnist.cli import main
from jaxmnist.errors import ConfigError
from jaxmnist.models.family import ModelConfig
from jaxmnist.report.describe import model_text
from jaxmnist.use import predict
from jaxmnist.use.serve import app as app_lib


@dataclass(frozen=True)
class TemperedConfig(ModelConfig):
    name: str = "tempered"
    temperature: float = 1.0  # the logits are divided by it


def _init(key, cfg, input_shape=(28, 28), num_classes=10):
    n = math.prod(input_shape)
    return {
        "w": jax.random.normal(key, (n, num_classes), jnp.float32) * math.sqrt(1.0 / n),
        "b": jnp.zeros((num_classes,), jnp.float32),
    }


def _apply(params, images, cfg, key=None, train=False):
    """A linear classifier whose logits are divided by `cfg.temperature`."""
    x = images.reshape(images.shape[0], -1).astype(jnp.float32)
    logits = (x @ params["w"] + params["b"]) / cfg.temperature
    return (logits, None) if train else logits


def _flops(cfg, input_shape, num_classes):
    return 6 * math.prod(input_shape) * num_classes


def _validate(cfg):
    if not cfg.temperature > 0:
        raise ConfigError(f"model.temperature: must be positive, got {cfg.temperature}")


def _describe(cfg):
    return f"{cfg.name} in → out ÷ {cfg.temperature:g}"


TEMPERED = models.Model(_init, _apply, _flops, _validate, TemperedConfig, _describe)


@pytest.fixture
def tempered():
    """The family, registered for one test and taken away after it."""
    models.register("tempered", TEMPERED)
    yield TEMPERED
    models.unregister("tempered")
    assert "tempered" not in models.MODELS


def confusion(labels, predicted, num_classes=10):
    out = np.zeros((num_classes, num_classes), np.int64)
    np.add.at(out, (labels, predicted), 1)
    return out


def test_a_registered_family_trains_evaluates_exports_and_serves_through_the_cli(
    tempered, train_argv, tiny_arrays, tmp_path, capsys
):
    run = tmp_path / "run"
    argv = train_argv(run, "--model", "tempered", "model.temperature=2", "--lr", "0.01")
    assert main([*argv, "--no-report", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["test_accuracy"] > 0.5  # it learnt the bright blocks
    saved = json.loads((run / "config.json").read_text())["model"]
    assert saved == {
        "name": "tempered",
        "activation": "relu",
        "dtype": "float32",
        "dropout": 0.0,
        "tta_shift": 0,
        "temperature": 2.0,
    }
    assert model_text(saved) == "tempered in → out ÷ 2, relu, compute float32"

    assert main(["eval", str(run), "--json"]) == 0
    evaluated = json.loads(capsys.readouterr().out)
    assert evaluated["test_accuracy"] == summary["test_accuracy"]

    model_file = tmp_path / "model.jaxexport"
    assert main(["export", str(run), "--out", str(model_file)]) == 0
    with open(model_file, "rb") as f:
        header = json.loads(f.readline())
        exported = jax.export.deserialize(bytearray(f.read()))
    assert header["trained"]["model_config"]["temperature"] == 2.0
    images, labels = tiny_arrays["test_images"], tiny_arrays["test_labels"]
    probs = np.asarray(exported.call(images))
    np.testing.assert_array_equal(
        confusion(labels, probs.argmax(-1)), evaluated["confusion_matrix"]
    )
    # The temperature reached the exported function: softmax((x W + b) / 2).
    with np.load(run / "params.npz") as p:
        w, b = p["['w']"], p["['b']"]
    logits = (images.reshape(len(images), -1) / 255.0) @ w + b
    np.testing.assert_allclose(probs, jax.nn.softmax(logits / 2.0), atol=1e-5)

    trained = predict.load_trained(run)
    with TestClient(app_lib.create_app(trained), base_url="http://127.0.0.1") as client:
        info = client.get("/api/model").json()
        assert info["model"] == "tempered" and info["model_config"]["temperature"] == 2.0
        assert info["description"] == _describe(trained.config.model)  # the family's words
        reply = client.post("/api/predict", json={"image": images[3].tolist()}).json()
    np.testing.assert_allclose(reply["probabilities"], probs[3], atol=1e-6)


def test_a_family_checks_its_own_field_and_refuses_others_in_one_line(
    tempered, train_argv, tmp_path, capsys
):
    run = tmp_path / "run"
    cases = [
        (["model.temperature=0"], "model.temperature: must be positive, got 0.0"),
        (["model.temperature=hot"], "model.temperature: expected float, got 'hot'"),
        (
            ["model.channels=4"],
            (
                "unknown config field 'model.channels' for the tempered model (a field of cnn); "
                "its fields: model.name, model.activation, model.dtype, model.dropout, "
                "model.tta_shift, model.temperature"
            ),
        ),
    ]
    for extra, message in cases:
        assert main([*train_argv(run, "--model", "tempered"), *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and message in err, err
    assert not run.exists()
    # The family's field is listed only while the family is the chosen one.
    cfg = config_lib.apply_overrides(config_lib.Config(), {"model.name": "tempered"})
    assert "model.temperature" in config_lib.field_names(cfg)
    assert "model.temperature" not in config_lib.field_names(config_lib.Config())


def test_another_familys_field_on_the_mlp_is_refused(capsys):
    assert main(["config", "model.channels=8,16"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "unknown config field 'model.channels' for the mlp model (a field of cnn)" in err


@pytest.mark.parametrize(
    "argv",
    [
        ["--model", "cnn", "model.channels=8,16"],
        ["model.channels=8,16", "--model", "cnn"],
        ["model.channels=8,16", "model.name=cnn"],
        ["model.name=cnn", "model.kernel_size=5", "model.channels=8,16"],
    ],
)
def test_switching_to_the_cnn_takes_its_fields_in_either_order(argv, capsys):
    assert main(["config", *argv]) == 0
    model = json.loads(capsys.readouterr().out)["model"]
    assert model["name"] == "cnn" and model["channels"] == [8, 16]
    # The fields both families declare carry over (the default MLP's hidden 256); the
    # rest are the CNN's defaults.
    assert model["hidden"] == [256] and model["padding"] == "same"
    assert model["kernel_size"] == ([5] if "model.kernel_size=5" in argv else [3])


def test_switching_keeps_common_fields_and_drops_the_old_familys(capsys):
    assert main(["config", "--preset", "cnn", "model.dropout=0.25", "--model", "mlp"]) == 0
    model = json.loads(capsys.readouterr().out)["model"]
    assert model == {
        "name": "mlp",
        "activation": "relu",
        "dtype": "float32",
        "dropout": 0.25,
        "tta_shift": 0,
        "hidden": [128],
    }
    # Back to the CNN: its own fields are its defaults again, not the preset's.
    cnn = config_lib.apply_overrides(config_lib.get_preset("speedrun"), {"model.name": "mlp"})
    back = config_lib.apply_overrides(cnn, {"model.name": "cnn"}).model
    assert back == models.model_config("cnn", hidden=(256,))


def test_a_saved_config_with_every_old_field_reads_back():
    """config.json of older versions held every family's fields in one flat section."""
    union = {
        "name": "mlp",
        "hidden": [256, 128],
        "activation": "gelu",
        "dtype": "float32",
        "channels": [24, 32],  # not the CNN's defaults: a speedrun preset switched to mlp
        "kernel_size": [5, 3],
        "padding": "valid",
        "conv_impl": "auto",
        "batch_norm": False,
        "dropout": 0.1,
    }
    cfg = config_lib.from_dict({**config_lib.Config().to_dict(), "model": union})
    assert cfg.model == models.model_config(
        "mlp", hidden=(256, 128), activation="gelu", dropout=0.1
    )
    cnn = config_lib.from_dict({"model": {**union, "name": "cnn", "batch_norm": True}}).model
    assert cnn == models.model_config(
        "cnn",
        hidden=(256, 128),
        activation="gelu",
        dropout=0.1,
        channels=(24, 32),
        kernel_size=(5, 3),
        padding="valid",
        batch_norm=True,
    )
    # A key that belongs to no family is still an error, not dropped.
    with pytest.raises(ConfigError, match="unknown config field 'model.width' for the mlp"):
        config_lib.from_dict({"model": {**union, "width": 3}})
    # Today's files are the family's fields only, and read back the same.
    for preset in config_lib.PRESETS.values():
        assert config_lib.from_dict(json.loads(json.dumps(preset.to_dict()))) == preset
    assert set(config_lib.get_preset("speedrun").to_dict()["model"]) == {
        "name",
        "activation",
        "dtype",
        "dropout",
        "tta_shift",
        "hidden",
        "channels",
        "kernel_size",
        "pool",
        "padding",
        "conv_impl",
        "batch_norm",
        "residual",
    }


def test_model_config_builds_a_familys_dataclass():
    assert models.model_config("cnn", channels=(4,)) == models.CNNConfig(channels=(4,))
    with pytest.raises(ConfigError, match="'model.channels' for the mlp model"):
        models.model_config("mlp", channels=(4,))
    with pytest.raises(ConfigError, match="unknown model 'resnet'; choose from: mlp, cnn"):
        models.model_config("resnet")
    with pytest.raises(TypeError, match="must derive from models.family.ModelConfig"):
        models.register("plain", TEMPERED._replace(config=dict))
    assert "plain" not in models.MODELS
