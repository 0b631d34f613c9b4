"""`jaxmnist predict` and the MNIST-style preprocessing, used the way a person would.

The model is a tiny run (its classes are bright blocks at class-specific places,
so its answers are checked on inputs fed as they are); the preprocessing is
checked on drawn strokes against MNIST's own geometry; a real-MNIST run, where
found, reads digits saved as ordinary photos-of-paper images.
"""

import io
import json
import shutil
import struct
import warnings
import zlib

import jax
import numpy as np
import pytest
from PIL import Image, ImageDraw
from scipy import ndimage

from jaxmnist.cli import main
from jaxmnist.errors import DataError
from jaxmnist.models import apply_uint8
from jaxmnist.use import predict, preprocess


def png_bytes(image: Image.Image, fmt: str = "PNG") -> bytes:
    buf = io.BytesIO()
    image.save(buf, format=fmt)
    return buf.getvalue()


def drawn_seven(size=(300, 240), ink=(20, 20, 20), paper=(250, 250, 245, 255), at=(40, 30)):
    """A '7' drawn with a thick pen on a page, away from the middle."""
    image = Image.new("RGBA", size, paper)
    x, y = at
    ImageDraw.Draw(image).line(
        [(x, y), (x + 90, y), (x + 40, y + 150)], fill=(*ink, 255), width=14, joint="curve"
    )
    return image


def model_answers(run_dir, images_u8):
    model = predict.load_trained(run_dir)
    logits = apply_uint8(model.params, images_u8, model.config.model)
    return np.asarray(jax.nn.softmax(logits, -1))


def test_preprocess_gives_mnist_geometry():
    """Ink scaled to a 20 px longer side, centred by mass at (14, 14), white on black."""
    out = preprocess.mnist_style(drawn_seven())
    assert out.dtype == np.uint8 and out.shape == (28, 28)
    rows, cols = np.nonzero(out)
    assert max(np.ptp(rows) + 1, np.ptp(cols) + 1) == 20
    cy, cx = ndimage.center_of_mass(out.astype(float))
    assert abs(cy - 14) <= 0.5 and abs(cx - 14) <= 0.5, (cy, cx)
    assert out.max() == 255 and out[0].max() == out[-1].max() == 0


def test_preprocess_ignores_colours_place_and_polarity():
    """White ink on black, a different place, and a transparent page all give the same input."""
    reference = preprocess.mnist_style(drawn_seven()).astype(int)
    moved = preprocess.mnist_style(drawn_seven(at=(150, 60))).astype(int)
    inverted = preprocess.mnist_style(
        drawn_seven(ink=(255, 255, 255), paper=(0, 0, 0, 255))
    ).astype(int)
    # Black ink on transparent black, as a canvas exports it: only alpha tells them apart,
    # and only compositing on white makes the page paper.
    transparent = preprocess.mnist_style(drawn_seven(ink=(0, 0, 0), paper=(0, 0, 0, 0)))
    transparent = transparent.astype(int)
    for other in (moved, inverted, transparent):
        assert np.abs(other - reference).mean() < 3


def test_blank_page_is_all_black():
    assert not preprocess.mnist_style(Image.new("RGB", (50, 40), "white")).any()


def test_no_preprocess_feeds_28x28_as_is(tmp_path):
    pixels = np.random.default_rng(0).integers(0, 256, (28, 28)).astype(np.uint8)
    out = preprocess.image_to_model_input(png_bytes(Image.fromarray(pixels)), preprocess=False)
    np.testing.assert_array_equal(out, pixels)
    with pytest.raises(preprocess.DataError, match="must be 28x28"):
        preprocess.image_to_model_input(png_bytes(drawn_seven()), "big.png", preprocess=False)


def test_predict_prints_top_k_of_arrays(tiny_model_run, tiny_arrays, tmp_path, capsys):
    images = tiny_arrays["test_images"][:12]
    np.save(tmp_path / "batch.npy", images)
    np.save(tmp_path / "one.npy", images[0].astype(np.float32) / 255)  # float in [0, 1]
    argv = ["predict", str(tiny_model_run), str(tmp_path / "batch.npy"), str(tmp_path / "one.npy")]
    assert main([*argv, "-k", "2", "--json"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["input"] for r in records] == [
        *(f"{tmp_path / 'batch.npy'}[{i}]" for i in range(12)),
        str(tmp_path / "one.npy"),
    ]
    expected = model_answers(tiny_model_run, np.concatenate([images, images[:1]]))
    for r, probs in zip(records, expected):
        assert [t["class"] for t in r["top"]] == list(np.argsort(-probs)[:2])
        assert r["top"][0]["probability"] == pytest.approx(probs.max(), abs=1e-5)
    assert main(argv) == 0
    out = capsys.readouterr()
    lines = out.out.splitlines()
    assert lines[0].split() == ["input", "top-1", "top-2", "top-3"] and len(lines) == 14
    assert "mlp trained on MNIST" in out.err


def _corrupt_files(good_png: bytes) -> dict[str, bytes]:
    def png_header(w, h):
        def chunk(kind, data):
            return (
                struct.pack(">I", len(data))
                + kind
                + data
                + struct.pack(">I", zlib.crc32(kind + data))
            )

        ihdr = struct.pack(">IIBBBBB", w, h, 8, 0, 0, 0, 0)
        return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IEND", b"")

    return {
        "corrupt.png": good_png[:40] + bytes(range(256)) * 4,
        "empty.png": b"",
        "truncated.png": good_png[: len(good_png) // 2],
        "notes.png": b"shopping list: milk, eggs\n",
        "zero.png": png_header(0, 0),
        # Pixels declared in 60 bytes: over twice Pillow's limit (it refuses them itself),
        # and just over the limit (Pillow only warns; predict refuses them too).
        "bomb.png": png_header(40_000, 40_000),
        "bomb-warned.png": png_header(10_000, 10_000),
    }


PROBLEMS = {
    "corrupt.png": "corrupt",
    "empty.png": "empty file",
    "truncated.png": "truncated",
    "notes.png": "not an image",
    "zero.png": "not an image",
    "bomb.png": "decompression bomb",
    "bomb-warned.png": "decompression bomb",
}


@pytest.mark.parametrize("bad", list(PROBLEMS))
def test_one_bad_file_does_not_cost_the_other_99(
    tiny_model_run, tiny_arrays, tmp_path, bad, capsys
):
    images = tiny_arrays["test_images"][:99]
    paths = []
    for i, image in enumerate(images):
        paths.append(tmp_path / f"digit{i:02d}.png")
        paths[-1].write_bytes(png_bytes(Image.fromarray(image)))
    (tmp_path / bad).write_bytes(_corrupt_files(paths[0].read_bytes())[bad])
    paths.insert(50, tmp_path / bad)
    with warnings.catch_warnings():  # as outside pytest, where Pillow's warning is no error
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        code = main(["predict", str(tiny_model_run), *map(str, paths), "--json", "--no-preprocess"])
    out = capsys.readouterr()
    assert code == 1
    records = [json.loads(line) for line in out.out.splitlines()]
    assert len(records) == 100
    assert records[50]["input"] == str(tmp_path / bad) and "top" not in records[50]
    good = [r for r in records if "top" in r]
    assert len(good) == 99
    expected = model_answers(tiny_model_run, images).argmax(-1)
    assert [r["top"][0]["class"] for r in good] == expected.tolist()
    errors = [line for line in out.err.splitlines() if "error" in line]
    assert len(errors) == 1 and str(tmp_path / bad) in errors[0], out.err
    assert PROBLEMS[bad] in errors[0], errors[0]
    assert "Traceback" not in out.err


def test_show_input_writes_what_the_model_saw(tiny_model_run, tmp_path, capsys):
    (tmp_path / "seven.png").write_bytes(png_bytes(drawn_seven(), "PNG"))
    (tmp_path / "seven.jpg").write_bytes(png_bytes(drawn_seven().convert("RGB"), "JPEG"))
    seen = tmp_path / "seen"
    inputs = [str(tmp_path / "seven.png"), str(tmp_path / "seven.jpg")]
    assert main(["predict", str(tiny_model_run), *inputs, "--show-input", str(seen)]) == 0
    written = sorted(seen.iterdir())
    assert [p.name for p in written] == ["0001-seven.png.png", "0002-seven.jpg.png"]
    expected = preprocess.mnist_style(drawn_seven())
    np.testing.assert_array_equal(np.asarray(Image.open(written[0])), expected)
    assert "wrote 2 model inputs" in capsys.readouterr().err


def test_run_directory_mistakes_exit_2(tiny_model_run, tmp_path, capsys):
    image = tmp_path / "x.png"
    image.write_bytes(png_bytes(drawn_seven()))
    assert main(["predict", str(tmp_path / "nowhere"), str(image)]) == 2
    unfinished = shutil.copytree(tiny_model_run, tmp_path / "unfinished")
    (unfinished / "params.npz").unlink()
    assert main(["predict", str(unfinished), str(image)]) == 2
    assert main(["predict", str(tiny_model_run), str(image), "-k", "11"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 3 and all(line.startswith("jaxmnist predict: error: ") for line in err)
    assert "no such run directory" in err[0] and "params.npz" in err[1]


def test_several_seeds_use_their_ensemble_or_the_member_chosen(
    tiny_seeds_run, tiny_registered, tiny_arrays, tmp_path, capsys
):
    run = tiny_seeds_run
    with np.load(run / "params.npz") as stored:
        stacked = {k: stored[k] for k in stored.files}
    for member, expected in ((None, stacked), (1, {k: v[1] for k, v in stacked.items()})):
        model = predict.load_trained(run, member)
        leaves = jax.tree_util.tree_leaves_with_path(model.params)
        for key, leaf in leaves:
            np.testing.assert_array_equal(np.asarray(leaf), expected[jax.tree_util.keystr(key)])
    np.save(tmp_path / "x.npy", tiny_arrays["test_images"][:3])
    capsys.readouterr()
    assert main(["predict", str(run), str(tmp_path / "x.npy")]) == 0
    assert "ensemble of 3: the mean of its members' softmax" in capsys.readouterr().err
    assert main(["predict", str(run), str(tmp_path / "x.npy"), "--member", "1"]) == 0
    assert "seed 1, member 1 of the run's 3" in capsys.readouterr().err


def test_report_images_go_through_the_model_input_path(tiny_dataset, monkeypatch):
    from jaxmnist.report import image_grids

    seen = []
    real = preprocess.as_model_input
    monkeypatch.setattr(preprocess, "as_model_input", lambda a, name="": seen.append(1) or real(a))
    image_grids.dataset_examples_png(tiny_dataset)
    assert seen


@pytest.mark.realdata
def test_reads_digits_saved_as_ordinary_images(real_mnist_run, tmp_path, capsys):
    """Real test digits as dark ink on light paper, enlarged, off-centre, in PNG/JPEG/BMP."""
    from jaxmnist.data import load_dataset

    test = load_dataset("mnist", download=False)
    paths = []
    for i in range(30):
        digit = Image.fromarray(255 - test.test_images[i]).resize(
            (140, 140), Image.Resampling.BICUBIC
        )
        page = Image.new("RGB", (320, 260), (245, 243, 238))
        page.paste(digit.convert("RGB"), (20 + 5 * i, 40 + 2 * i))
        paths.append(tmp_path / f"d{i}.{('png', 'jpg', 'bmp')[i % 3]}")
        page.save(paths[-1])
    assert main(["predict", str(real_mnist_run), *map(str, paths), "--json", "-k", "1"]) == 0
    predicted = [
        json.loads(line)["top"][0]["class"] for line in capsys.readouterr().out.splitlines()
    ]
    correct = np.mean(np.array(predicted) == test.test_labels[:30])
    assert correct >= 0.85, (predicted, test.test_labels[:30].tolist())


def fashion_copy(run_dir, tmp_path):
    """The tiny run relabelled as a Fashion-MNIST run (same shapes, other classes)."""
    run = shutil.copytree(run_dir, tmp_path / "fashion-run")
    config = json.loads((run / "config.json").read_text())
    config["data"]["dataset"] = "fashion_mnist"
    (run / "config.json").write_text(json.dumps(config))
    return run


def extent(image_u8):
    rows, cols = np.nonzero(image_u8)
    return np.ptp(rows) + 1, np.ptp(cols) + 1


def test_fashion_runs_preprocess_like_fashion_mnist(tiny_model_run, tmp_path, capsys):
    """Fashion-MNIST's products were trimmed, scaled to a 28 px longer side and centred."""
    photo = Image.new("RGB", (300, 200), (250, 250, 250))
    ImageDraw.Draw(photo).rectangle([30, 40, 89, 159], fill=(90, 60, 40))  # 60 x 120 px
    (tmp_path / "bag.png").write_bytes(png_bytes(photo))
    seen = tmp_path / "seen"
    run = fashion_copy(tiny_model_run, tmp_path)
    assert main(["predict", str(run), str(tmp_path / "bag.png"), "--show-input", str(seen)]) == 0
    out = np.asarray(Image.open(next(seen.iterdir())))
    assert extent(out) == (28, 14)
    cols = np.nonzero(out.any(0))[0]
    assert (cols[0], 27 - cols[-1]) == (7, 7)  # centred
    assert extent(preprocess.mnist_style(photo)) == (20, 10)
    assert "Fashion-MNIST" in capsys.readouterr().err


def test_npz_uses_its_image_arrays_and_bad_arrays_are_one_line_each(
    tiny_model_run, tiny_arrays, tmp_path, capsys
):
    images, labels = tiny_arrays["test_images"][:5], tiny_arrays["test_labels"][:5]
    np.savez(tmp_path / "set.npz", x_test=images, y_test=labels)  # Keras's layout
    np.savez(tmp_path / "labels.npz", y=labels)
    np.save(tmp_path / "wrong.npy", np.zeros((3, 32, 32), np.uint8))
    np.save(tmp_path / "bright.npy", np.full((28, 28), 2.0))  # float outside [0, 1]
    (tmp_path / "junk.npy").write_bytes(b"\x93NUMPY garbage")
    names = ["set.npz", "labels.npz", "wrong.npy", "bright.npy", "junk.npy"]
    code = main(["predict", str(tiny_model_run), *(str(tmp_path / n) for n in names), "--json"])
    out = capsys.readouterr()
    assert code == 1
    records = [json.loads(line) for line in out.out.splitlines()]
    assert [r["input"] for r in records[:5]] == [
        f"{tmp_path}/set.npz:x_test[{i}]" for i in range(5)
    ]
    assert all("top" in r for r in records[:5]) and all("error" in r for r in records[5:])
    errors = [line for line in out.err.splitlines() if "error:" in line]
    assert len(errors) == 4 and all(str(tmp_path) in line for line in errors), errors


def test_an_input_with_no_ink_is_predicted_with_a_warning(tiny_model_run, tmp_path, capsys):
    """White ink on a transparent page and an all-zero array end black after preprocessing:
    the model still names a class, so predict says, per input, that it read nothing."""
    white_on_clear = drawn_seven(ink=(255, 255, 255), paper=(0, 0, 0, 0))
    (tmp_path / "clear.png").write_bytes(png_bytes(white_on_clear))
    (tmp_path / "seven.png").write_bytes(png_bytes(drawn_seven()))
    np.save(tmp_path / "zeros.npy", np.zeros((28, 28), np.uint8))
    names = [str(tmp_path / n) for n in ("clear.png", "seven.png", "zeros.npy")]
    assert main(["predict", str(tiny_model_run), *names, "--json"]) == 0
    out = capsys.readouterr()
    records = [json.loads(line) for line in out.out.splitlines()]
    assert [r["input"] for r in records] == names and all("top" in r for r in records)
    assert [r.get("warning") for r in records] == [
        "no ink after preprocessing",
        None,
        "no ink after preprocessing",
    ]
    warnings_ = [line for line in out.err.splitlines() if "warning" in line]
    assert warnings_ == [
        f"jaxmnist predict: warning: {names[0]}: no ink after preprocessing",
        f"jaxmnist predict: warning: {names[2]}: no ink after preprocessing",
    ]
    assert main(["predict", str(tiny_model_run), names[1], names[2]]) == 0  # the table too
    out = capsys.readouterr()
    assert len(out.out.splitlines()) == 3
    assert out.err.splitlines()[-1] == (
        f"jaxmnist predict: warning: {names[2]}: no ink after preprocessing"
    )


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "GIF", "WEBP", "BMP", "TIFF", "PPM"])
def test_the_raster_formats_a_digit_comes_in_are_read(fmt):
    buf = io.BytesIO()
    Image.new("L", (28, 28), 255).save(buf, fmt)
    assert preprocess.decode_image(buf.getvalue()).size == (28, 28)


@pytest.mark.parametrize("fmt", ["EPS", "PCX", "ICO", "TGA"])
def test_other_formats_pillow_knows_are_refused_before_decoding(fmt):
    """EPS would run Ghostscript on what a client sent: no format beyond the list is read."""
    buf = io.BytesIO()
    Image.new("RGB", (28, 28), "white").save(buf, fmt)
    Image.open(io.BytesIO(buf.getvalue()))  # Pillow itself would open it
    with pytest.raises(DataError, match="x.eps: not an image jaxmnist reads"):
        preprocess.decode_image(buf.getvalue(), "x.eps")
