"""Turning people's images into what the model was trained on: uint8 (28, 28), white ink on black.

MNIST itself was made this way (LeCun et al.): each digit was size-normalised to
fit a 20x20 box keeping its aspect ratio, anti-aliased, and placed in a 28x28
field so that its centre of mass lies in the middle (pixel (14, 14), measured on
the training set). `mnist_style` repeats those steps for any image: grayscale
with transparency composited on white, inverted when the background is light,
the background level subtracted and the contrast stretched, cropped to the ink,
the longer side scaled to 20 px, and centred by mass. Fashion-MNIST's products
were trimmed, scaled to a 28 px longer side and centred: `fashion_style`.
`as_model_input` is the
other road in, for arrays already in the model's format. `predict`, `serve` and
the report's image grids all go through this module, so what they show is what
the model sees. Nothing here imports JAX.
"""

from __future__ import annotations

import io
import warnings

import numpy as np
from PIL import Image
from scipy import ndimage

from jaxmnist.errors import DataError

SIZE = 28  # the model's input is SIZE x SIZE
BOX = 20  # MNIST scaled each digit's longer side to 20 px
CENTRE = 14.0  # mean centre of mass of the MNIST training digits, in pixel indices
INK = 0.15  # after the contrast stretch, pixels above this fraction of white count as ink
WORKING_SIZE = 512  # huge photos are shrunk to this first: the result is 20 px anyway


def decode_image(data: bytes, name: str = "image") -> Image.Image:
    """Pillow image from file bytes; DataError naming `name` for anything unreadable.

    Pillow's decompression-bomb warning (over `Image.MAX_IMAGE_PIXELS` pixels) is
    treated as the error it almost always is for a handwritten digit.
    """
    if not data:
        raise DataError(f"{name}: empty file")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data))
            image.load()  # decode now: a truncated file fails here, not later
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise DataError(f"{name}: too many pixels, refused as a decompression bomb ({e})") from None
    except Image.UnidentifiedImageError:
        raise DataError(f"{name}: not an image Pillow can read") from None
    except (OSError, SyntaxError, ValueError, EOFError) as e:
        # Pillow reports truncated or corrupt data as any of these.
        raise DataError(f"{name}: corrupt or truncated image ({e})") from None
    if image.width == 0 or image.height == 0:
        raise DataError(f"{name}: image is {image.width}x{image.height} pixels")
    return image


def grayscale(image: Image.Image) -> np.ndarray:
    """float32 (H, W) in [0, 255]: luminance, with any transparency composited on white."""
    if image.mode in ("I", "I;16", "I;16B", "I;16L", "F"):  # 16-bit or float scans
        values = np.asarray(image.convert("F"), np.float32)
        top = values.max()
        return values * (255.0 / top) if top > 255 else values
    if image.mode in ("RGBA", "LA", "PA") or "transparency" in image.info:
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        image = Image.alpha_composite(white, rgba)
    return np.asarray(image.convert("L"), np.float32)


def _shrink(image: Image.Image) -> Image.Image:
    if max(image.size) <= WORKING_SIZE:
        return image
    image = image.copy()
    image.thumbnail((WORKING_SIZE, WORKING_SIZE), Image.Resampling.BOX)
    return image


def ink_on_black(gray: np.ndarray) -> np.ndarray:
    """float32 (H, W) in [0, 1], ink bright: inverted if the border is light, the
    background level (the border's median) removed, and the brightest ink at 1."""
    border = np.concatenate([gray[0], gray[-1], gray[:, 0], gray[:, -1]])
    if np.median(border) > 127.5:  # dark ink on light paper: MNIST is the other way round
        gray = 255.0 - gray
        border = 255.0 - border
    ink = np.clip(gray - np.median(border), 0.0, None)
    top = ink.max()
    return ink / top if top > 0 else ink


def _normalise(image: Image.Image, box: int, by_mass: bool) -> np.ndarray:
    """uint8 (28, 28): the ink cropped, its longer side scaled to `box` px, placed so its
    centre of mass (`by_mass`) or its middle is at the centre. No ink: all black."""
    ink = ink_on_black(grayscale(_shrink(image)))
    mask = ink > INK
    rows, cols = np.flatnonzero(mask.any(1)), np.flatnonzero(mask.any(0))
    out = np.zeros((SIZE, SIZE), np.uint8)
    if not len(rows):
        return out
    crop = ink[rows[0] : rows[-1] + 1, cols[0] : cols[-1] + 1]
    h, w = crop.shape
    scale = box / max(h, w)
    size = (max(1, round(w * scale)), max(1, round(h * scale)))
    # LANCZOS anti-aliases when shrinking, as MNIST's normalisation did.
    small = np.asarray(
        Image.fromarray(np.round(crop * 255).astype(np.uint8)).resize(
            size, Image.Resampling.LANCZOS
        )
    )
    if not small.any():
        return out
    if by_mass:
        cy, cx = ndimage.center_of_mass(small.astype(np.float64))
    else:
        cy, cx = (small.shape[0] - 1) / 2, (small.shape[1] - 1) / 2
    centre = CENTRE if by_mass else (SIZE - 1) / 2
    # Whole-pixel shifts keep the strokes sharp; the box stays inside the field.
    top = int(np.clip(round(centre - cy), 0, SIZE - small.shape[0]))
    left = int(np.clip(round(centre - cx), 0, SIZE - small.shape[1]))
    out[top : top + small.shape[0], left : left + small.shape[1]] = small
    return out


def mnist_style(image: Image.Image) -> np.ndarray:
    """uint8 (28, 28): `image` made the way MNIST digits were (see the module docstring):
    longer side 20 px, centre of mass at (14, 14). Blank paper comes back all black."""
    return _normalise(image, BOX, by_mass=True)


def fashion_style(image: Image.Image) -> np.ndarray:
    """uint8 (28, 28): `image` made the way Fashion-MNIST's product photos were (Xiao et
    al. 2017): trimmed to the product, longer side 28 px, centred, light background
    turned black."""
    return _normalise(image, SIZE, by_mass=False)


STYLES = {"fashion_mnist": fashion_style}  # datasets not made like MNIST's digits


def style_for(dataset: str):
    """The preprocessing that made `dataset`'s images (MNIST's for any other)."""
    return STYLES.get(dataset, mnist_style)


def as_is(image: Image.Image, name: str = "image") -> np.ndarray:
    """uint8 (28, 28): a 28x28 image's grayscale pixels unchanged (no inversion, no
    cropping); DataError for any other size."""
    if image.size != (SIZE, SIZE):
        raise DataError(
            f"{name}: is {image.width}x{image.height}; without preprocessing it must be "
            f"{SIZE}x{SIZE}"
        )
    return np.round(grayscale(image)).astype(np.uint8)


def image_to_model_input(
    data: bytes, name: str = "image", preprocess: bool = True, dataset: str = "mnist"
) -> np.ndarray:
    """uint8 (28, 28) from the bytes of an image file, made like `dataset`'s images
    (or as it is, when not `preprocess`); DataError if unusable."""
    image = decode_image(data, name)
    return style_for(dataset)(image) if preprocess else as_is(image, name)


def as_model_input(array, name: str = "array") -> np.ndarray:
    """uint8 (N, 28, 28) from an array already in the model's format: (N, 28, 28) or
    (28, 28), uint8, or float in [0, 1] (scaled by 255 and rounded). DataError otherwise."""
    a = np.asarray(array)
    if a.ndim == 2:
        a = a[None]
    if a.ndim != 3 or a.shape[1:] != (SIZE, SIZE):
        raise DataError(
            f"{name}: shape {a.shape}, expected (N, {SIZE}, {SIZE}) or ({SIZE}, {SIZE})"
        )
    if a.dtype == np.uint8:
        return a
    if a.dtype.kind in "iu":
        if a.size and (a.min() < 0 or a.max() > 255):
            raise DataError(f"{name}: integer pixels must be within 0..255")
        return a.astype(np.uint8)
    if a.dtype.kind == "f":
        if not np.isfinite(a).all() or (a.size and (a.min() < 0 or a.max() > 1)):
            raise DataError(f"{name}: float pixels must be finite and within [0, 1]")
        return np.round(a * 255).astype(np.uint8)
    raise DataError(f"{name}: dtype {a.dtype} is not a pixel type (uint8, or float in [0, 1])")


def to_png(image_u8: np.ndarray) -> bytes:
    """PNG bytes of one uint8 (H, W) image, pixel for pixel."""
    buf = io.BytesIO()
    Image.fromarray(np.asarray(image_u8, np.uint8)).save(buf, format="PNG")
    return buf.getvalue()
