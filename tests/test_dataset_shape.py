"""A dataset owns its shape: a synthetic 32x32 RGB dataset of 5 classes, registered for
these tests only, goes through the real CLI end to end.

Train (the MLP, writing its report, and the CNN with augmentation), eval, predict on
PNG files of other sizes and modes, export, devices and serve all read the image
height, width, channels, class names and preprocessing from the dataset's spec; nothing
in the package says 28, 1 or 10 for them.
"""

import dataclasses
import io
import json
import time

import jax
import numpy as np
import pytest

TestClient = pytest.importorskip("starlette.testclient", reason="needs the serve extra").TestClient
from PIL import Image, ImageDraw
from scipy import ndimage

from jaxmnist.cli import main
from jaxmnist.data import formats, load_dataset, registry, synthetic
from jaxmnist.models import cnn
from jaxmnist.use import predict, preprocess

NAME = "rgb32"
CLASSES = ("red", "green", "blue", "cyan", "magenta")
SHAPE = (32, 32, 3)


@pytest.fixture(scope="module")
def arrays():
    a = synthetic.tiny_arrays(
        64, 40, seed=1, image_shape=SHAPE[:2], channels=SHAPE[2], num_classes=len(CLASSES)
    )
    a["test_labels"][: len(CLASSES)] = np.arange(len(CLASSES))  # every class in the test set
    return a


@pytest.fixture(scope="module")
def spec(arrays):
    return synthetic.tiny_spec(arrays, name=NAME, class_names=CLASSES, preprocessing="none")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory, arrays, spec):
    """The dataset as IDX files in a data folder, in `registry.DATASETS` while the module's
    tests run (removed afterwards)."""
    root = tmp_path_factory.mktemp("rgb-data")
    synthetic.write_idx_folder(root / spec.folder, arrays, spec)
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(registry.DATASETS, NAME, spec)
        mp.setenv("XDG_CACHE_HOME", str(root / "cache"))
        yield root
    assert NAME not in registry.DATASETS


def train(run, data_dir, *extra) -> dict:
    argv = ["train", "--dataset", NAME, "--data-dir", str(data_dir), "--run-dir", str(run)]
    argv += ["--batch-size", "16", "--epochs", "2", "--hidden", "16", "--no-compile-cache"]
    assert main([*argv, "--json", *extra]) == 0
    return json.loads((run / "summary.json").read_text())


@pytest.fixture(scope="module")
def mlp_run(tmp_path_factory, data_dir):
    run = tmp_path_factory.mktemp("runs") / "mlp"
    train(run, data_dir)  # with its report: the colour images must reach the figures
    return run


@pytest.fixture(scope="module")
def cnn_run(tmp_path_factory, data_dir):
    run = tmp_path_factory.mktemp("runs") / "cnn"
    augment = ["data.augment=true", "data.max_shift=2", "data.max_rotation=10", "data.flip=true"]
    train(run, data_dir, "--model", "cnn", "model.channels=4,8", "--no-report", *augment)
    return run


def png(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def photo(size=(50, 40), mode="RGB") -> Image.Image:
    image = Image.new("RGB", size, (250, 240, 230))
    ImageDraw.Draw(image).ellipse([8, 6, size[0] - 9, size[1] - 7], fill=(200, 30, 40))
    return image.convert(mode)


def test_the_spec_says_the_shape_and_the_files_hold_it(data_dir, spec, arrays):
    assert (spec.height, spec.width, spec.channels) == SHAPE and spec.image_shape == SHAPE
    assert spec.num_classes == 5 and spec.class_names == CLASSES
    assert spec.file("train_images").name == "train-images-idx4-ubyte"
    mnist = registry.get_spec("mnist")  # one channel: arrays stay (N, H, W)
    assert mnist.image_shape == (28, 28) and mnist.channels == 1
    assert registry.get_spec("fashion_mnist").preprocessing == "fashion"
    ds = load_dataset(NAME, data_dir, download=False)
    assert ds.train_images.shape == (64, *SHAPE) and ds.test_images.shape == (40, *SHAPE)
    np.testing.assert_array_equal(ds.test_images, arrays["test_images"])
    # The npz copy is read and checked the same way.
    npz = data_dir / "npz" / "data.npz"
    npz.parent.mkdir()
    npz.write_bytes(synthetic.npz_bytes(arrays))
    got, _ = formats.load_npz(npz, spec)
    assert got["train_images"].shape == (64, *SHAPE)
    with pytest.raises(ValueError, match="preprocessing"):
        dataclasses.replace(spec, preprocessing="jpeg")


def test_models_take_the_channels_from_the_input_shape():
    cfg = cnn.CNNConfig(channels=(4, 8), hidden=(16,), conv_impl="im2col")
    params = cnn.init(jax.random.key(0), cfg, SHAPE, 5)
    assert params["conv"][0]["w"].shape == (3, 3, 3, 4)
    logits = cnn.apply(params, np.zeros((2, *SHAPE), np.float32), cfg)
    assert logits.shape == (2, 5)
    gray = cnn.flops_per_example(cfg, SHAPE[:2], 5)
    assert cnn.flops_per_example(cfg, SHAPE, 5) > gray  # the first layer reads 3 channels


def test_train_eval_and_report_on_colour_images(mlp_run, cnn_run, data_dir, capsys):
    for run in (mlp_run, cnn_run):
        summary = json.loads((run / "summary.json").read_text())
        assert 0 <= summary["test_accuracy"] <= 1
        capsys.readouterr()
        assert main(["eval", str(run), "--data-dir", str(data_dir), "--json"]) == 0
        result = json.loads(capsys.readouterr().out)
        assert result["class_names"] == list(CLASSES)
        assert result["test_accuracy"] == summary["test_accuracy"]
    assert not (cnn_run / "report.html").exists()
    text = (mlp_run / "report.html").read_text()
    assert all(name in text for name in CLASSES)
    examples = np.asarray(Image.open(mlp_run / "plots" / "class_examples.png").convert("RGB"))
    r, g, b = (examples[..., c].astype(int) for c in range(3))
    assert (np.abs(r - g) > 60).any() and (np.abs(g - b) > 60).any()  # shown in colour


def test_predict_reads_pngs_of_any_size_and_mode(cnn_run, tmp_path, capsys):
    inputs = {
        "wide.png": photo((50, 40)),
        "tall-rgba.png": photo((30, 70), "RGBA"),
        "gray.png": photo((40, 40), "L"),
        "exact.png": photo((32, 32)),
    }
    for name, image in inputs.items():
        (tmp_path / name).write_bytes(png(image))
    paths = [str(tmp_path / n) for n in inputs]
    seen = tmp_path / "seen"
    argv = ["predict", str(cnn_run), *paths, "--json", "-k", "5", "--show-input", str(seen)]
    assert main(argv) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["input"] for r in records] == paths
    for r in records:
        assert sorted(t["name"] for t in r["top"]) == sorted(CLASSES)
        assert abs(sum(t["probability"] for t in r["top"]) - 1) < 1e-4
    shown = [np.asarray(Image.open(p)) for p in sorted(seen.iterdir())]
    assert all(s.shape == SHAPE for s in shown)
    # "none": the whole image resized, colours kept (red stays red).
    wide = shown[0].astype(int)
    assert (wide[..., 0] - wide[..., 1] > 100).any()
    # --no-preprocess: an image of the dataset's size is fed as it is, anything else refused.
    argv = ["predict", str(cnn_run), paths[3], "--no-preprocess", "--show-input", str(seen)]
    assert main(argv) == 0
    assert main(["predict", str(cnn_run), paths[0], "--no-preprocess"]) == 1
    assert "must be 32x32" in capsys.readouterr().err
    exact = [p for p in sorted(seen.iterdir()) if "exact" in p.name]
    np.testing.assert_array_equal(
        np.asarray(Image.open(exact[-1])), np.asarray(inputs["exact.png"])
    )


def test_predict_reads_arrays_of_the_datasets_shape(cnn_run, arrays, tmp_path, capsys):
    np.save(tmp_path / "batch.npy", arrays["test_images"][:3])
    np.save(tmp_path / "one.npy", arrays["test_images"][3] / 255)
    np.save(tmp_path / "gray.npy", arrays["test_images"][:3, ..., 0])
    paths = [str(tmp_path / n) for n in ("batch.npy", "one.npy", "gray.npy")]
    assert main(["predict", str(cnn_run), *paths, "--json"]) == 1
    out = capsys.readouterr()
    records = [json.loads(line) for line in out.out.splitlines()]
    assert [("top" in r) for r in records] == [True] * 4 + [False]
    assert "no (N, 32, 32, 3) or (32, 32, 3) array" in records[-1]["error"]
    model = predict.load_trained(cnn_run)
    expected = predict.compile_predict(model, 4)(arrays["test_images"][:4])
    assert [r["top"][0]["class"] for r in records[:4]] == expected.argmax(-1).tolist()


def test_export_runs_on_colour_batches(cnn_run, arrays, tmp_path):
    out = tmp_path / "model.jaxexport"
    assert main(["export", str(cnn_run), "--out", str(out), "--platforms", "cpu"]) == 0
    with open(out, "rb") as f:
        header = json.loads(f.readline())
        exported = jax.export.deserialize(bytearray(f.read()))
    assert header["input"]["shape"] == ["batch", *SHAPE] and header["class_names"] == list(CLASSES)
    assert "32x32 RGB" in header["input"]["preprocessing"]
    batch = arrays["test_images"][:2]
    probs = np.asarray(exported.call(batch))
    assert probs.shape == (2, 5)
    model = predict.load_trained(cnn_run)
    np.testing.assert_allclose(probs, predict.compile_predict(model, 2)(batch), atol=1e-5)


def test_devices_places_the_datasets_shapes(data_dir, capsys):
    assert (
        main(["devices", "--dataset", NAME, "--model", "cnn", "--batch-size", "8", "--json"]) == 0
    )
    report = json.loads(capsys.readouterr().out)
    placement = report.get("placement", report)
    assert placement["batch"]["shape"] == [8, *SHAPE]
    assert placement["logits"]["shape"][-1] == 5


def test_serve_shows_the_classes_and_answers_colour_images(mlp_run, arrays):
    from jaxmnist.use.serve import app as app_lib  # the serve extra

    model = predict.load_trained(mlp_run)
    with TestClient(app_lib.create_app(model), base_url="http://127.0.0.1") as c:
        info = c.get("/api/model").json()
        assert info["class_names"] == list(CLASSES) and info["input_shape"] == list(SHAPE)
        assert (info["height"], info["width"], info["channels"]) == SHAPE
        assert info["handwritten"] is False and info["image_size"] == "32x32 RGB"
        assert c.get("/").status_code == 200
        reply = c.post("/api/predict", content=png(photo((64, 48))))
        assert reply.status_code == 200, reply.text
        result = reply.json()
        assert len(result["probabilities"]) == 5 and result["class_names"] == list(CLASSES)
        assert np.asarray(result["input"]).shape == SHAPE
        image = arrays["test_images"][0]
        result = c.post("/api/predict", json={"image": image.tolist()}).json()
        expected = predict.compile_predict(model, 1)(image[None])[0]
        np.testing.assert_allclose(result["probabilities"], expected, atol=1e-6)
        wrong = c.post("/api/predict", json={"image": image[..., 0].tolist()})
        assert wrong.status_code == 400 and "32x32x3" in wrong.json()["error"]


@pytest.mark.parametrize("preprocessing", ["mnist", "fashion", "none"])
def test_a_persons_colour_image_is_made_like_the_datasets(spec, preprocessing):
    """Each preprocessing, at 32x32 RGB: the shape and colours are kept, the ink placed
    as the style says (MNIST: a box of 20/28 of the field, the mass at its centre)."""
    styled = dataclasses.replace(spec, preprocessing=preprocessing)
    out = preprocess.image_to_model_input(png(photo((90, 60))), "photo.png", True, styled)
    assert out.shape == SHAPE and out.dtype == np.uint8
    ink = out.max(-1) > 0
    rows, cols = np.flatnonzero(ink.any(1)), np.flatnonzero(ink.any(0))
    longer = max(rows[-1] - rows[0], cols[-1] - cols[0]) + 1
    assert longer == {"mnist": round(20 * 32 / 28), "fashion": 32, "none": 32}[preprocessing]
    if preprocessing == "mnist":
        cy, cx = ndimage.center_of_mass(out.max(-1).astype(float))
        assert abs(cy - 16) <= 0.5 and abs(cx - 16) <= 0.5, (cy, cx)  # 14/28 of the field
    if preprocessing != "none":  # light paper turned black; the red ellipse stays red
        assert out[0, 0].max() == 0 and (out[..., 0].astype(int) - out[..., 1] > 100).any()
    gray = dataclasses.replace(styled, channels=1)
    assert preprocess.image_to_model_input(png(photo()), "p", True, gray).shape == (32, 32)


@pytest.mark.browser
def test_the_page_shows_the_colour_input_at_the_datasets_size(mlp_run, tmp_path):
    """In a real browser: the 5 class names, a drop zone, and what the model saw drawn as
    a 32x32 colour image."""
    from chromium import BROWSER, Chromium, evaluate, open_page
    from test_serve_browser import LiveServer, check_network_and_console, upload, wait_idle

    if BROWSER is None:
        pytest.skip("no Chromium installed (apt-get install chromium)")
    live = LiveServer(mlp_run)
    path = tmp_path / "red.png"
    photo((80, 60)).save(path)
    browser = Chromium(tmp_path / "profile")
    try:
        session = open_page(browser, live.url, 1280, 900, mobile=False)
        wait_idle(browser, session)
        labels, caption = evaluate(
            browser,
            session,
            "[Array.from(document.querySelectorAll('.label')).map(e => e.textContent),"
            " document.getElementById('seen-caption').textContent]",
        )
        upload(browser, session, path)
        time.sleep(0.1)
        wait_idle(browser, session)
        seen = evaluate(
            browser,
            session,
            "(c => [c.width, c.height, Array.from(c.getContext('2d')"
            ".getImageData(0, 0, c.width, c.height).data)])(document.getElementById('seen'))",
        )
        check_network_and_console(browser, session, live.url)
    finally:
        browser.close()
        live.stop()
    assert labels == list(CLASSES) and caption == "What the model saw (32×32 RGB)"
    width, height, data = seen
    rgba = np.asarray(data).reshape(height, width, 4)
    assert (width, height) == (32, 32)
    model = predict.load_trained(mlp_run)
    expected = preprocess.image_to_model_input(path.read_bytes(), "red.png", True, model.dataset)
    np.testing.assert_array_equal(rgba[..., :3], expected)
