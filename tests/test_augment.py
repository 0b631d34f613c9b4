"""Augmentation: a pure function of (key, uint8 images) that keeps shape, dtype and labels."""

import dataclasses
import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from jaxmnist import config as config_lib
from jaxmnist.data import augment as augment_lib
from jaxmnist.errors import ConfigError

ON = config_lib.DataConfig(augment=True, max_shift=2)
ROTATE = dataclasses.replace(ON, max_rotation=15.0)
AFFINE = dataclasses.replace(ROTATE, max_scale=0.15, max_shear=12.0)
ERASE = dataclasses.replace(ON, erase=0.5)
ERASE_ONLY = dataclasses.replace(ON, max_shift=0, erase=1.0)
ELASTIC = dataclasses.replace(ON, max_shift=1, elastic_alpha=34.0, elastic_sigma=4.0)
augment = jax.jit(augment_lib.augment, static_argnums=2)


@pytest.fixture(scope="module")
def images():
    """Eight bright, distinct blobs well inside a zero border wider than any shift."""
    rng = np.random.default_rng(0)
    out = np.zeros((8, 28, 28), np.uint8)
    out[:, 6:22, 6:22] = rng.integers(1, 256, (8, 16, 16))
    return jnp.asarray(out)


def _shifted(image: np.ndarray, dy: int, dx: int) -> np.ndarray:
    return np.roll(image, (dy, dx), axis=(0, 1))  # exact here: the border is zeros


@pytest.mark.parametrize(
    "cfg",
    [ON, ROTATE, AFFINE, ERASE_ONLY, ELASTIC],
    ids=["translate", "rotate", "affine", "erase", "elastic"],
)
def test_shape_dtype_kept_same_key_same_result_new_key_new_result(images, cfg):
    a = augment(jax.random.key(1), images, cfg)
    assert a.shape == images.shape and a.dtype == jnp.uint8
    np.testing.assert_array_equal(a, augment(jax.random.key(1), images, cfg))
    b = augment(jax.random.key(2), images, cfg)
    assert not np.array_equal(a, b)
    assert not np.array_equal(a, images)


def test_each_image_is_its_own_integer_translation_within_max_shift(images):
    out = np.asarray(augment(jax.random.key(3), images, ON))
    src = np.asarray(images)
    offsets = []
    for i in range(len(src)):
        found = [
            (dy, dx)
            for dy in range(-2, 3)
            for dx in range(-2, 3)
            if np.array_equal(out[i], _shifted(src[i], dy, dx))
        ]
        assert len(found) == 1, f"image {i} is not a translation within 2 pixels"
        offsets += found
    assert len(set(offsets)) > 1  # drawn per image, not once per batch


def test_the_translations_reach_every_offset_in_both_directions_both_ends_included():
    """±2 pixels: every one of -2..2 down and across is drawn, and nothing beyond (a
    range of [-s + 1, s] passed the test above)."""
    rng = np.random.default_rng(0)
    src = np.zeros((300, 28, 28), np.uint8)
    src[:, 2:-2, 2:-2] = rng.integers(1, 256, (300, 24, 24))  # a border of zeros: exact rolls
    out = np.asarray(augment(jax.random.key(5), jnp.asarray(src), ON))
    drawn = set()
    for i in range(len(src)):
        found = [
            (dy, dx)
            for dy in range(-3, 4)
            for dx in range(-3, 4)
            if np.array_equal(out[i], _shifted(src[i], dy, dx))
        ]
        assert len(found) == 1, i
        drawn |= set(found)
    assert {dy for dy, _ in drawn} == {dx for _, dx in drawn} == set(range(-2, 3))


@pytest.mark.parametrize("shape", [(64, 28, 28), (16, 9, 13, 3)], ids=["gray", "channels"])
@pytest.mark.parametrize("max_shift", [1, 2, 3])
@pytest.mark.accelerator
def test_the_accelerators_translation_is_the_cpus_exactly(shape, max_shift):
    # A TPU runs the CPU's per-image crop (a gather) as a loop over the images; its
    # selects among shifted copies must move every image by the same offset.
    full = jnp.asarray(np.random.default_rng(5).integers(0, 256, shape, np.uint8))
    key = jax.random.key(max_shift)
    translate = jax.jit(augment_lib.random_translate, static_argnums=(2, 3))
    cpu = translate(key, full, max_shift, "cpu")
    tpu = translate(key, full, max_shift, "tpu")
    assert tpu.dtype == jnp.uint8
    np.testing.assert_array_equal(tpu, cpu)
    assert not np.array_equal(cpu, full)


@pytest.mark.parametrize("shape", [(12, 12), (12, 12, 3)], ids=["gray", "channels"])
def test_the_dense_warp_multiplies_at_the_highest_precision(shape):
    """Pinned in the program, where no CPU's value can show it: at an accelerator's
    default precision the bilinear weights are rounded to bfloat16."""
    image = jnp.zeros(shape, jnp.float32)
    rows = cols = jnp.zeros((5, 7), jnp.float32)
    jaxpr = jax.make_jaxpr(augment_lib.bilinear_dense)(image, rows, cols).jaxpr
    dots = [e for e in jaxpr.eqns if e.primitive.name == "dot_general"]
    assert len(dots) == 2
    highest = (lax.Precision.HIGHEST, lax.Precision.HIGHEST)
    assert all(e.params["precision"] == highest for e in dots)


@pytest.mark.parametrize("shape", [(32, 28, 28), (6, 9, 13, 3)], ids=["gray", "channels"])
@pytest.mark.accelerator
def test_the_accelerators_warp_samples_as_the_cpus(shape):
    # A TPU runs map_coordinates' gather as a loop over the images; the dense sums that
    # replace it there must give every pixel the same value, up to float rounding.
    rng = np.random.default_rng(6)
    b, h, w = shape[:3]
    full = jnp.asarray(rng.integers(0, 256, shape, np.uint8))
    rows, cols = (jnp.asarray(rng.uniform(-2, n + 1, (h, w)), jnp.float32) for n in (h, w))
    plane = full[0].astype(jnp.float32)
    dense = augment_lib.bilinear_dense(plane, rows, cols)
    if plane.ndim == 3:
        plane, dense = plane[..., 1], dense[..., 1]
    gathered = jax.scipy.ndimage.map_coordinates(plane, [rows, cols], order=1, cval=0.0)
    np.testing.assert_allclose(dense, gathered, atol=1e-3)
    angles = rng.uniform(-0.5, 0.5, b)
    inverse = np.stack([[np.cos(angles), np.sin(angles)], [-np.sin(angles), np.cos(angles)]])
    inverse = jnp.asarray(inverse.transpose(2, 0, 1) * rng.uniform(0.8, 1.2, (b, 1, 1)))
    shifts = jnp.asarray(rng.integers(-2, 3, (b, 2)), jnp.float32)
    field = jnp.asarray(rng.normal(0, 2, (b, 2, h, w)), jnp.float32)
    warp = jax.jit(augment_lib.warp_images, static_argnums=4)
    cpu = np.asarray(warp(full, inverse, shifts, field, "cpu"), np.int32)
    tpu = np.asarray(warp(full, inverse, shifts, field, "tpu"), np.int32)
    assert np.abs(tpu - cpu).max() <= 1 and np.mean(tpu != cpu) < 1e-3  # rounding at .5
    assert np.mean(cpu == 0) < 0.5  # mostly inside the image: the test samples pixels
    program = jax.make_jaxpr(augment_lib.warp_images, static_argnums=4)
    assert "gather" not in str(program(full, inverse, shifts, field, "tpu"))


def test_off_or_zero_moves_is_the_identity(images):
    for cfg in [
        dataclasses.replace(ON, augment=False),
        dataclasses.replace(ON, max_shift=0),
        dataclasses.replace(ROTATE, augment=False),
        dataclasses.replace(ERASE_ONLY, augment=False),
        dataclasses.replace(ERASE_ONLY, erase=0.0),
    ]:
        np.testing.assert_array_equal(augment(jax.random.key(4), images, cfg), images)


def test_flip_mirrors_a_random_half_and_leaves_the_moves_as_they_were(images):
    flip_only = dataclasses.replace(ON, max_shift=0, flip=True)
    out, src = np.asarray(augment(jax.random.key(7), images, flip_only)), np.asarray(images)
    mirrored = [np.array_equal(o, s[:, ::-1]) for o, s in zip(out, src, strict=True)]
    kept = [np.array_equal(o, s) for o, s in zip(out, src, strict=True)]
    assert all(m != k for m, k in zip(mirrored, kept, strict=True))  # each one or the other
    assert 0 < sum(mirrored) < len(src)  # drawn per image
    both = np.asarray(augment(jax.random.key(7), images, dataclasses.replace(ON, flip=True)))
    moved = np.asarray(augment(jax.random.key(7), jnp.asarray(out), ON))
    np.testing.assert_array_equal(both, moved)  # the flips, then the same key's moves


def _changed_box(before: np.ndarray, after: np.ndarray):
    """(rows, cols) slices of the smallest rectangle holding every changed pixel, and the
    share of its pixels that changed; None when nothing changed."""
    changed = before != after
    if changed.ndim == 3:
        changed = changed.any(-1)
    if not changed.any():
        return None
    rows, cols = np.flatnonzero(changed.any(1)), np.flatnonzero(changed.any(0))
    box = (slice(rows[0], rows[-1] + 1), slice(cols[0], cols[-1] + 1))
    return box, changed[box].mean()


def test_erasing_fills_one_rectangle_of_each_image_with_noise_of_the_papers_sizes():
    blank = jnp.zeros((64, 28, 28), jnp.uint8)  # noise differs from 0 at 255 of 256 pixels
    out = np.asarray(augment(jax.random.key(9), blank, ERASE_ONLY))
    sizes = set()
    for i in range(len(out)):
        found = _changed_box(np.asarray(blank[i]), out[i])
        assert found is not None, f"image {i} was not erased at probability 1"
        (rows, cols), filled = found
        assert filled > 0.9, f"image {i}: not one filled rectangle ({filled:.2f})"
        area = (rows.stop - rows.start) * (cols.stop - cols.start)
        # The paper's 2-40% of the image, give or take the rounding of each side.
        assert 0.02 * 784 - 8 <= area <= 0.4 * 784 + 25, (i, area)
        sizes.add((rows.stop - rows.start, cols.stop - cols.start))
    assert len(sizes) > len(out) // 2  # drawn per image
    assert len(np.unique(out[out > 0])) > 200  # random values, not one colour


def test_erasing_happens_to_about_its_share_and_leaves_the_moves_as_they_were(images):
    many = jnp.zeros((2000, 28, 28), jnp.uint8)
    out = np.asarray(augment(jax.random.key(10), many, dataclasses.replace(ERASE_ONLY, erase=0.3)))
    share = (out.reshape(len(out), -1) > 0).any(1).mean()
    assert 0.25 < share < 0.35, share  # 0.3 within about 5 standard deviations
    moved = np.asarray(augment(jax.random.key(11), images, ROTATE))
    both = np.asarray(augment(jax.random.key(11), images, dataclasses.replace(ROTATE, erase=1.0)))
    for i in range(len(moved)):  # the same key's moves, then a rectangle erased
        (rows, cols), filled = _changed_box(moved[i], both[i])
        assert filled > 0.9, f"image {i}: the rectangle was turned with the image"
        outside = np.ones(moved[i].shape, bool)
        outside[rows, cols] = False
        np.testing.assert_array_equal(both[i][outside], moved[i][outside])


def test_a_tiny_rotation_is_an_integer_translation(images):
    # With the angle ~0 the bilinear warp samples on the pixel grid: it must reduce to
    # the same crops as the translation, which pins its coordinate arithmetic.
    cfg = dataclasses.replace(ON, max_shift=1, max_rotation=1e-6)
    out, src = np.asarray(augment(jax.random.key(5), images, cfg)), np.asarray(images)
    for i in range(len(src)):
        assert any(
            np.array_equal(out[i], _shifted(src[i], dy, dx))
            for dy in (-1, 0, 1)
            for dx in (-1, 0, 1)
        ), f"image {i}"


def test_rotation_keeps_the_ink_roughly(images):
    out = np.asarray(augment(jax.random.key(6), images, ROTATE), np.float64)
    src = np.asarray(images, np.float64)
    ratio = out.sum(axis=(1, 2)) / src.sum(axis=(1, 2))
    assert np.all((ratio > 0.9) & (ratio < 1.1)), ratio


@pytest.mark.parametrize(
    "cfg",
    [
        ON,
        ROTATE,
        AFFINE,
        dataclasses.replace(ROTATE, flip=True),
        dataclasses.replace(ON, flip=True),
        dataclasses.replace(AFFINE, elastic_alpha=20.0),
    ],
    ids=["translate", "rotate", "affine", "rotate-flip", "translate-flip", "affine-elastic"],
)
def test_colour_images_move_every_channel_as_one(images, cfg):
    """(B, H, W, C): each channel gets exactly the moves its image's key draws for a
    one-channel batch, so the channels stay aligned."""
    rgb = jnp.stack([images, 255 - images, images // 2], axis=-1)  # (8, 28, 28, 3)
    out = np.asarray(augment(jax.random.key(8), rgb, cfg))
    assert out.shape == rgb.shape and out.dtype == np.uint8
    for c in range(3):
        alone = augment(jax.random.key(8), rgb[..., c], cfg)
        np.testing.assert_array_equal(out[..., c], alone)
    assert not np.array_equal(out, rgb)


def test_colour_images_lose_the_same_rectangle_in_every_channel():
    blank = jnp.zeros((16, 28, 28, 3), jnp.uint8)
    out = np.asarray(augment(jax.random.key(12), blank, ERASE_ONLY))
    for i in range(len(out)):
        boxes = [_changed_box(np.zeros((28, 28), np.uint8), out[i, ..., c])[0] for c in range(3)]
        assert boxes[0] == boxes[1] == boxes[2], (i, boxes)
        assert not np.array_equal(out[i, ..., 0], out[i, ..., 1])  # each channel its own noise


def test_it_never_sees_labels():
    assert list(inspect.signature(augment_lib.augment).parameters) == ["key", "images", "cfg"]


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("max_shift", "-1", "data.max_shift must be >= 0"),
        ("max_rotation", "200", r"data.max_rotation: degrees in \[0, 180\]"),
        ("max_rotation", "nan", "data.max_rotation"),
        ("max_scale", "1", r"data.max_scale: a fraction in \[0, 1\)"),
        ("max_scale", "-0.1", "data.max_scale"),
        ("max_shear", "60", r"data.max_shear: degrees in \[0, 45\]"),
        ("max_shear", "nan", "data.max_shear"),
        ("erase", "1.5", r"data.erase: a probability in \[0, 1\]"),
        ("erase", "nan", "data.erase"),
        ("elastic_alpha", "-1", r"data.elastic_alpha: pixels in \[0, 100\]"),
        ("elastic_alpha", "nan", "data.elastic_alpha"),
        ("elastic_sigma", "0.1", r"data.elastic_sigma: pixels in \[0.5, 28\]"),
        ("elastic_sigma", "40", "data.elastic_sigma"),
        ("elastic_sigma", "nan", "data.elastic_sigma"),
    ],
)
def test_bad_augment_fields_are_config_errors(field, value, message):
    cfg = config_lib.apply_overrides(config_lib.Config(), {f"data.{field}": value})
    with pytest.raises(ConfigError, match=message):
        config_lib.validate(cfg)


@pytest.mark.parametrize(
    "scale, shear", [(0.2, 0.0), (0.0, 20.0), (0.2, 20.0)], ids=["scale", "shear", "both"]
)
@pytest.mark.accelerator
def test_scale_and_shear_are_the_affine_warp_scipy_computes(images, scale, shear):
    """The drawn scale and shear of each image (from the same key streams) applied by
    scipy.ndimage.affine_transform, bilinear, zero fill: the same pixels, give or take
    one grey level where float32 and float64 round a half differently."""
    from scipy import ndimage as scipy_ndimage

    cfg = dataclasses.replace(ON, max_shift=1, max_scale=scale, max_shear=shear)
    key = jax.random.key(11)
    out = np.asarray(augment(key, images, cfg))
    _, k_shift = jax.random.split(key)
    k_scale, k_shear = jax.random.split(jax.random.fold_in(key, augment_lib.AFFINE_STREAM))
    b = len(images)
    shifts = np.asarray(jax.random.randint(k_shift, (b, 2), -1, 2), np.float64)
    scales = 1 + np.asarray(jax.random.uniform(k_scale, (b,), jnp.float32, -scale, scale))
    limit = np.radians(shear)
    tans = np.tan(np.asarray(jax.random.uniform(k_shear, (b,), jnp.float32, -limit, limit)))
    centre = np.array([13.5, 13.5])
    for i in range(b):
        forward = np.array([[1.0, 0.0], [tans[i], 1.0]]) * scales[i]  # shear · scale
        inverse = np.linalg.inv(forward)
        offset = centre - inverse @ (centre + shifts[i])
        want = scipy_ndimage.affine_transform(
            np.asarray(images[i], np.float64), inverse, offset, order=1, cval=0.0
        )
        want = np.clip(np.round(want), 0, 255)
        assert np.abs(out[i].astype(int) - want.astype(int)).max() <= 1, f"image {i}"
    assert not np.array_equal(out, np.asarray(images))


def test_rotation_alone_draws_what_it_drew_before_scale_and_shear_existed(images):
    """No scale and no shear: the warp is the rotation's, to the bit (a run started before
    these fields resumes with the same augmented batches)."""
    key = jax.random.key(12)
    out = np.asarray(augment(key, images, ROTATE))
    k_angle, k_shift = jax.random.split(key)
    angles = jax.random.uniform(k_angle, (8,), jnp.float32, -np.radians(15.0), np.radians(15.0))
    shifts = jax.random.randint(k_shift, (8, 2), -2, 3).astype(jnp.float32)
    cos, sin = jnp.cos(angles), jnp.sin(angles)
    rotation_inv = jnp.stack([jnp.stack([cos, sin], -1), jnp.stack([-sin, cos], -1)], -2)
    np.testing.assert_array_equal(out, augment_lib.warp_images(images, rotation_inv, shifts))


def _smoothed_noise(field_key, b: int, alpha: float, sigma: float) -> np.ndarray:
    """An elastic field rebuilt with scipy: the uniform draws of `field_key`, each plane
    smoothed by scipy's Gaussian filter (zero beyond the image), times alpha."""
    from scipy import ndimage as scipy_ndimage

    noise = np.asarray(jax.random.uniform(field_key, (b * 2 * 28 * 28,), jnp.float32, -1, 1))
    planes = noise.reshape(b * 2, 28, 28).astype(np.float64)
    smooth = [scipy_ndimage.gaussian_filter(p, sigma, mode="constant") for p in planes]
    return alpha * np.asarray(smooth).reshape(b, 2, 28, 28)


@pytest.mark.parametrize("sigma", [4.0, 6.0, 1.5])
def test_the_elastic_field_is_uniform_noise_smoothed_as_scipy_smooths_it(sigma):
    key = jax.random.key(21)
    field = np.asarray(augment_lib.elastic_field(key, (3, 28, 28), 34.0, sigma))
    assert field.shape == (3, 2, 28, 28) and field.dtype == np.float32
    np.testing.assert_allclose(field, _smoothed_noise(key, 3, 34.0, sigma), atol=2e-5)
    assert field.std() > 0.5  # pixels: a real displacement, not a rounding


def test_an_elastic_distortion_samples_each_pixel_at_its_displaced_position(images):
    """Elastic distortion with 1-pixel shifts and no affine part: the output pixel at p is
    the input, bilinear with zero fill (scipy's map_coordinates), at p - shift + field(p),
    the field drawn from its own key stream: the same pixels give or take one grey level
    (float32 against float64)."""
    from scipy import ndimage as scipy_ndimage

    key = jax.random.key(22)
    out = np.asarray(augment(key, images, ELASTIC))
    _, k_shift = jax.random.split(key)
    shifts = np.asarray(jax.random.randint(k_shift, (8, 2), -1, 2), np.float64)
    field = _smoothed_noise(jax.random.fold_in(key, augment_lib.ELASTIC_STREAM), 8, 34.0, 4.0)
    rows, cols = np.meshgrid(np.arange(28.0), np.arange(28.0), indexing="ij")
    for i in range(8):
        where = [rows - shifts[i, 0] + field[i, 0], cols - shifts[i, 1] + field[i, 1]]
        want = scipy_ndimage.map_coordinates(
            np.asarray(images[i], np.float64), where, order=1, cval=0.0
        )
        want = np.clip(np.round(want), 0, 255)
        assert np.abs(out[i].astype(int) - want.astype(int)).max() <= 1, f"image {i}"
    plain = augment(key, images, dataclasses.replace(ELASTIC, elastic_alpha=0.0))
    assert (out != np.asarray(plain)).mean() > 0.05  # the field moved a real share of pixels
