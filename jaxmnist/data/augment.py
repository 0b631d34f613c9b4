"""Data augmentation on the device: a pure function of a key and a uint8 batch.

`augment(key, images, cfg)` moves every image of a batch (B, H, W), or (B, H, W, C)
for images of several channels, by its own random offset
(zero-padding by `max_shift` pixels and cropping back to the original size, the usual
pad-and-random-crop), when `max_rotation` is set also turns it by a random angle, and
with `flip` mirrors a random half of them left-right (for clothes, never for digits), and
with `erase` fills a random rectangle of some of them with noise (random erasing).
It sees no labels, so it cannot disturb them; it keeps shape and dtype, so it slots into
the compiled epoch between the batch gather and the model; and it is deterministic in its
key, so a run stays reproducible from its seed while each key (each step, epoch and
member of a population) draws different offsets. With `cfg.augment` off it returns the
images unchanged, so a caller can always call it.

Translations alone are an exact integer crop (about a copy of the batch: a gather on the
CPU, selects among shifted copies elsewhere; `random_translate`).
Rotations, scaling (`max_scale`: a factor within 1 ± max_scale) and shear (`max_shear`
degrees) need interpolation: the whole move becomes one affine warp about the centre
with bilinear sampling (`jax.scipy.ndimage.map_coordinates`), rounded back to uint8.
Elastic distortion (`elastic_alpha`, `elastic_sigma`: Simard, Steinkraus and Platt,
"Best practices for convolutional neural networks applied to visual document analysis",
2003) adds to that warp's sampling positions a smooth random field: each pixel's
displacement drawn uniform in [-1, 1] along each axis, smoothed by a Gaussian of
`elastic_sigma` pixels (zero beyond the image, cut at 4 sigma, as
`scipy.ndimage.gaussian_filter` with mode "constant") and scaled by `elastic_alpha`.
Every channel of an image moves with it, by the same offset, matrix, field and flip.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.scipy import ndimage

from jaxmnist import rng


def augment(key: jax.Array, images: jax.Array, cfg) -> jax.Array:
    """images: uint8 (B, H, W) or (B, H, W, C) -> the same shape, each image moved at random.

    cfg: DataConfig (`augment`, `max_shift` in pixels, `max_rotation` and `max_shear` in
    degrees, `max_scale` a fraction, `flip`).
    """
    if not cfg.augment:
        return images
    if cfg.flip:  # its own draw, so the moves are those of the same key without flips
        images = random_flip(jax.random.fold_in(key, FLIP_STREAM), images)
    if cfg.max_rotation != 0 or cfg.max_scale != 0 or cfg.max_shear != 0 or cfg.elastic_alpha:
        images = random_warp(
            key,
            images,
            cfg.max_shift,
            cfg.max_rotation,
            cfg.max_scale,
            cfg.max_shear,
            elastic=(cfg.elastic_alpha, cfg.elastic_sigma),
        )
    elif cfg.max_shift != 0:
        images = random_translate(key, images, cfg.max_shift)
    if cfg.erase != 0:  # its own draw too, on the moved images
        images = random_erase(jax.random.fold_in(key, ERASE_STREAM), images, cfg.erase)
    return images


FLIP_STREAM = 0x666C6970  # fold_in data for the flips' key ("flip"), far from split indices
ERASE_STREAM = 0x657261  # fold_in data for the erasing's key ("era")
# Random erasing's rectangle (Zhong et al., "Random Erasing Data Augmentation", 2017, and
# torchvision's RandomErasing): its area a fraction of the image's, its aspect ratio
# (height / width) drawn log-uniformly, both from the paper's defaults.
ERASE_AREA = (0.02, 0.4)
ERASE_RATIO = (0.3, 1 / 0.3)


def random_flip(key: jax.Array, images: jax.Array) -> jax.Array:
    """Each image of (B, H, W) or (B, H, W, C) mirrored left-right with probability 1/2."""
    mirror = rng.flat(jax.random.bernoulli, key, (images.shape[0],) + (1,) * (images.ndim - 1))
    return jnp.where(mirror, images[:, :, ::-1], images)


def random_erase(key: jax.Array, images: jax.Array, prob: float) -> jax.Array:
    """Each image of (B, H, W) or (B, H, W, C), with probability `prob`, gets one
    rectangle of random pixel values (every channel its own): area and aspect ratio as
    `ERASE_AREA` and `ERASE_RATIO`, at a uniform place where it fits. Where the paper
    draws again a rectangle that does not fit, its sides are cut to the image's here,
    so that every draw is one pass. uint8 in, uint8 out."""
    b, h, w = images.shape[:3]
    k_on, k_area, k_ratio, k_row, k_col, k_fill = jax.random.split(key, 6)
    on = jax.random.bernoulli(k_on, prob, (b,))
    area = h * w * jax.random.uniform(k_area, (b,), jnp.float32, *ERASE_AREA)
    ratio = jnp.exp(jax.random.uniform(k_ratio, (b,), jnp.float32, *map(math.log, ERASE_RATIO)))
    tall = jnp.clip(jnp.round(jnp.sqrt(area * ratio)), 1, h).astype(jnp.int32)
    wide = jnp.clip(jnp.round(jnp.sqrt(area / ratio)), 1, w).astype(jnp.int32)
    top = jnp.floor(jax.random.uniform(k_row, (b,)) * (h - tall + 1)).astype(jnp.int32)
    left = jnp.floor(jax.random.uniform(k_col, (b,)) * (w - wide + 1)).astype(jnp.int32)
    rows = jnp.arange(h)[None, :, None]
    cols = jnp.arange(w)[None, None, :]
    inside = (
        on[:, None, None]
        & (rows >= top[:, None, None])
        & (rows < (top + tall)[:, None, None])
        & (cols >= left[:, None, None])
        & (cols < (left + wide)[:, None, None])
    )
    inside = inside.reshape(inside.shape + (1,) * (images.ndim - 3))
    noise = rng.flat(jax.random.randint, k_fill, images.shape, minval=0, maxval=256)
    noise = noise.astype(images.dtype)
    return jnp.where(inside, noise, images)


def random_translate(
    key: jax.Array, images: jax.Array, max_shift: int, backend: str | None = None
) -> jax.Array:
    """Pad by `max_shift` zeros, crop each image back at its own random offset.

    images (B, H, W) or (B, H, W, C), any dtype -> same; offsets uniform in
    [-max_shift, max_shift]². On the CPU each crop is a slice of its own (one gather);
    elsewhere (`backend`, default JAX's) every image picks its rows, then its columns,
    among the 2·max_shift + 1 shifted copies of the batch (elementwise selects that
    fuse), since a TPU runs that gather as a loop over the images. The two are equal
    exactly.
    """
    b, h, w, *c = images.shape
    s = max_shift
    padded = jnp.pad(images, ((0, 0), (s, s), (s, s), *((0, 0),) * len(c)))
    corners = rng.flat(jax.random.randint, key, (b, 2), minval=0, maxval=2 * s + 1)
    if (backend or jax.default_backend()) != "cpu":
        offsets = range(2 * s + 1)
        top, left = (corners[:, i].reshape(b, *(1,) * (images.ndim - 1)) for i in (0, 1))
        rows = jnp.select([top == k for k in offsets], [padded[:, k : k + h] for k in offsets])
        return jnp.select([left == k for k in offsets], [rows[:, :, k : k + w] for k in offsets])

    def crop(image, corner):
        return lax.dynamic_slice(image, (corner[0], corner[1], *(0,) * len(c)), (h, w, *c))

    return jax.vmap(crop)(padded, corners)


def random_warp(
    key: jax.Array,
    images: jax.Array,
    max_shift: int,
    max_rotation: float,
    max_scale: float = 0.0,
    max_shear: float = 0.0,
    elastic: tuple[float, float] = (0.0, 4.0),
    backend: str | None = None,
) -> jax.Array:
    """A random affine move per image: about the centre, a rotation (uniform in
    ±`max_rotation` degrees), a scale factor (uniform in 1 ± `max_scale`, the same along
    both axes) and a horizontal shear (uniform in ±`max_shear` degrees), then an integer
    shift (uniform in ±`max_shift`), with `elastic` = (alpha, sigma) an elastic field
    on top (`elastic_field`; alpha 0: none); one bilinear warp with zero fill
    (`warp_images`, which `backend` is passed to). images uint8 (B, H, W) or
    (B, H, W, C) -> the same shape."""
    b = images.shape[0]
    k_angle, k_shift = jax.random.split(key)  # as with rotations alone: the same draws
    k_scale, k_shear = jax.random.split(jax.random.fold_in(key, AFFINE_STREAM))
    limit = math.radians(max_rotation)
    angles = jax.random.uniform(k_angle, (b,), jnp.float32, -limit, limit)
    shifts = rng.flat(jax.random.randint, k_shift, (b, 2), minval=-max_shift, maxval=max_shift + 1)
    shifts = shifts.astype(jnp.float32)
    scales = 1 + jax.random.uniform(k_scale, (b,), jnp.float32, -max_scale, max_scale)
    shear_limit = math.radians(max_shear)
    shears = jnp.tan(jax.random.uniform(k_shear, (b,), jnp.float32, -shear_limit, shear_limit))
    # The map from an output pixel back to where it samples, in (row, col) about the
    # centre: the inverse of rotation · shear · scale, written out, so that with no shear
    # and no scale it is the rotation's inverse to the bit (the runs before these fields).
    cos, sin = jnp.cos(angles), jnp.sin(angles)
    one = jnp.ones_like(cos)
    rotation_inv = jnp.stack([jnp.stack([cos, sin], -1), jnp.stack([-sin, cos], -1)], -2)
    shear_inv = jnp.stack([jnp.stack([one, 0 * one], -1), jnp.stack([-shears, one], -1)], -2)
    inverse = (shear_inv @ rotation_inv) / scales[:, None, None]
    alpha, sigma = elastic
    field = None
    if alpha:
        k_field = jax.random.fold_in(key, ELASTIC_STREAM)
        field = elastic_field(k_field, (b, *images.shape[1:3]), alpha, sigma)
    return warp_images(images, inverse, shifts, field, backend)


AFFINE_STREAM = 0x616666  # fold_in data for the scale and shear keys ("aff")
ELASTIC_STREAM = 0x656C61  # fold_in data for the elastic field's key ("ela")


def gaussian_matrix(n: int, sigma: float) -> np.ndarray:
    """(n, n) float32: row i holds the weights that smooth position i of a length-n signal
    with a Gaussian of `sigma` (cut at 4 sigma, normalised over the whole kernel, zero
    beyond the ends), so that G @ u is `scipy.ndimage.gaussian_filter1d(u, sigma,
    mode="constant")`."""
    radius = int(4.0 * sigma + 0.5)
    taps = np.exp(-0.5 * (np.arange(-radius, radius + 1) / sigma) ** 2)
    offsets = np.arange(n)[:, None] - np.arange(n)[None, :]
    weights = np.exp(-0.5 * (offsets / sigma) ** 2) / taps.sum()
    return np.where(np.abs(offsets) <= radius, weights, 0.0).astype(np.float32)


def elastic_field(key: jax.Array, shape: tuple[int, int, int], alpha: float, sigma: float):
    """(B, 2, H, W) float32 displacements (rows, cols) for `shape` = (B, H, W): uniform in
    [-1, 1] per pixel and axis, smoothed by a Gaussian of `sigma` pixels along both axes
    (`gaussian_matrix`), times `alpha`."""
    b, h, w = shape
    noise = rng.flat(jax.random.uniform, key, (b, 2, h, w), minval=-1.0, maxval=1.0)
    smooth = gaussian_matrix(h, sigma) @ noise @ gaussian_matrix(w, sigma).T
    return alpha * smooth


def warp_images(
    images: jax.Array,
    inverse: jax.Array,
    shifts: jax.Array,
    field: jax.Array | None = None,
    backend: str | None = None,
) -> jax.Array:
    """Each image moved by an affine map about the centre: the output pixel at p shows the
    input at `inverse` (p - centre - shift) + centre (+ field[:, :, p] where a field of
    displacements is given), bilinear, zero outside. images uint8 (B, H, W) or
    (B, H, W, C); inverse float (B, 2, 2) over (row, col); shifts (B, 2); field
    (B, 2, H, W) or None.

    On the CPU each output pixel gathers its four neighbours
    (`jax.scipy.ndimage.map_coordinates`); elsewhere (`backend`, default JAX's) the same
    sums are written dense (`bilinear_dense`), since a TPU runs that gather as a loop.
    """
    h, w = images.shape[1:3]
    rows, cols = jnp.meshgrid(jnp.arange(h, dtype=jnp.float32), jnp.arange(w, dtype=jnp.float32))
    rows, cols = rows.T, cols.T  # (H, W) grids of output coordinates
    cy, cx = (h - 1) / 2, (w - 1) / 2
    dense = (backend or jax.default_backend()) != "cpu"

    def warp(image, m, shift, moved):
        y, x = rows - cy - shift[0], cols - cx - shift[1]
        src = [m[0, 0] * y + m[0, 1] * x + cy, m[1, 0] * y + m[1, 1] * x + cx]
        if moved is not None:
            src = [src[0] + moved[0], src[1] + moved[1]]

        if dense:
            return bilinear_dense(image.astype(jnp.float32), *src)

        def plane(p):
            return ndimage.map_coordinates(p.astype(jnp.float32), src, order=1, cval=0.0)

        # Several channels: each is warped by the same coordinates.
        return plane(image) if image.ndim == 2 else jax.vmap(plane, -1, -1)(image)

    out = jax.vmap(warp)(images, inverse.astype(jnp.float32), shifts, field)  # None: no leaves
    return jnp.clip(jnp.round(out), 0, 255).astype(jnp.uint8)


def bilinear_dense(image: jax.Array, rows: jax.Array, cols: jax.Array) -> jax.Array:
    """Bilinear sampling with zero fill as dense arithmetic: image float (H, W) or
    (H, W, C), sampled at (rows, cols), each (P, Q) -> (P, Q) or (P, Q, C).

    Pixel (i, j) weighs hat(row - i) · hat(col - j) in the sample at (row, col), where
    hat(d) = max(0, 1 - |d|): the four neighbours' bilinear weights, and zero for every
    other pixel and beyond the image. Summed over j (a matmul) and then over i, in float32
    throughout (`Precision.HIGHEST`: an accelerator's default would round the weights to
    bfloat16); `map_coordinates(order=1, cval=0)` gives the same up to rounding.
    """

    def hat(coords, n):  # (P, Q) positions -> (P, Q, n) weights of pixels 0 .. n - 1
        return jnp.maximum(
            0.0, 1.0 - jnp.abs(coords[..., None] - jnp.arange(n, dtype=coords.dtype))
        )

    h, w = image.shape[:2]
    hat_rows, hat_cols = hat(rows, h), hat(cols, w)
    exact = lax.Precision.HIGHEST
    along_rows = jnp.einsum("pqj,ij...->pqi...", hat_cols, image, precision=exact)
    return jnp.einsum("pqi,pqi...->pq...", hat_rows, along_rows, precision=exact)


EXAMPLE_STREAM = 0x657861  # fold_in data for the report's examples ("exa")


def examples(images, labels, cfg, seed: int, moves: int = 2):
    """For the report: the first training image of each class as stored, then `moves`
    rows of the same images as augmentation moves them (keys drawn from `seed`).
    images uint8 (N, H, W[, C]), labels (N,) -> (uint8 ((1 + moves) * K, ...), labels)."""
    labels = np.asarray(labels)
    first = [int(np.argmax(labels == c)) for c in np.unique(labels)]  # in class order
    picked = jnp.asarray(np.asarray(images)[first])
    key = jax.random.fold_in(jax.random.key(seed), EXAMPLE_STREAM)
    rows = [picked] + [augment(jax.random.fold_in(key, i), picked, cfg) for i in range(moves)]
    return np.concatenate([np.asarray(r) for r in rows]), np.tile(labels[first], 1 + moves)
