"""Turning people's images into what a model was trained on: uint8 images of its dataset's shape.

Each dataset says how its images were made (`DatasetSpec.preprocessing`); this module
repeats that for any image, at the dataset's size (`spec.image_shape`):

- "mnist" (`mnist_style`): MNIST itself was made this way (LeCun et al.): each digit was
  size-normalised to fit a 20x20 box keeping its aspect ratio, anti-aliased, and placed
  in a 28x28 field so that its centre of mass lies in the middle (pixel (14, 14),
  measured on the training set). Here: transparency composited on white, inverted when
  the background is light, the background level subtracted and the contrast stretched,
  cropped to the ink, the longer side scaled to the box, and centred by mass. For other
  field sizes the box and the centre scale with the field (20/28 and 14/28 of it).
- "fashion" (`fashion_style`): Fashion-MNIST's products were trimmed, scaled to a longer
  side of the field's size and centred; the light background turns black.
- "none" (`resized`): the whole image resized to the field, nothing else.

A dataset of one channel gets luminance; one of three channels gets RGB, its colours
kept (`ink_on_black`; ink is found, and its centre of mass taken, on the brightest
channel). `as_is` is
what `--no-preprocess` feeds: an image already at the dataset's size, its pixels
unchanged. `as_model_input` is the other road in, for arrays already in the model's
format. `predict`, `serve` and the report's image grids all go through this module, so
what they show is what the model sees. Nothing here imports JAX.
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Callable
from functools import partial

import numpy as np
from PIL import Image

from jaxmnist.data.registry import FASHION_MNIST, MNIST, DatasetSpec, get_spec
from jaxmnist.errors import DataError

# MNIST's normalisation (the "mnist" preprocessing), in its own 28 px field: the longer
# side of the ink scaled to 20 px, the centre of mass at pixel 14. Other field sizes scale
# both with the field.
MNIST_FIELD, MNIST_BOX, MNIST_CENTRE = 28, 20, 14.0
INK = 0.15  # after the contrast stretch, pixels above this fraction of white count as ink
WORKING_SIZE = 512  # huge photos are shrunk to this first (or twice the field, if larger)
LUMA = np.array([0.299, 0.587, 0.114], np.float32)  # ITU-R 601, as Pillow's "L" mode
# The raster formats a digit comes in. Pillow would also open others, some through
# external programs (EPS runs Ghostscript): a server must not, so none of them does.
FORMATS = ("PNG", "JPEG", "GIF", "WEBP", "BMP", "TIFF", "PPM")
FORMAT_NAMES = "PNG, JPEG, GIF, WebP, BMP, TIFF or PGM/PPM"


class ImageTooLarge(DataError):
    """An image whose header declares more pixels than the caller's cap (or Pillow's)."""


def decode_image(data: bytes, name: str = "image", max_pixels: int | None = None) -> Image.Image:
    """Pillow image from file bytes; DataError naming `name` for anything unreadable.

    Pillow's decompression-bomb warning (over `Image.MAX_IMAGE_PIXELS` pixels) is
    treated as the error it almost always is for a handwritten digit. `max_pixels`, if
    given, is a tighter cap (ImageTooLarge), checked on the size the file's header
    declares, before a pixel is decoded: `Image.open` reads only the header.
    """
    if not data:
        raise DataError(f"{name}: empty file")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data), formats=FORMATS)
            width, height = image.size
            if max_pixels is not None and width * height > max_pixels:
                raise ImageTooLarge(
                    f"{name}: {width}x{height} pixels ({width * height / 1e6:.1f} megapixels), "
                    f"over the limit of {max_pixels / 1e6:g} megapixels"
                )
            image.load()  # decode now: a truncated file fails here, not later
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise ImageTooLarge(
            f"{name}: too many pixels, refused as a decompression bomb ({e})"
        ) from None
    except Image.UnidentifiedImageError:
        raise DataError(f"{name}: not an image jaxmnist reads ({FORMAT_NAMES})") from None
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


def rgb(image: Image.Image) -> np.ndarray:
    """float32 (H, W, 3) in [0, 255]: colour, with any transparency composited on white."""
    if image.mode in ("I", "I;16", "I;16B", "I;16L", "F"):  # 16-bit or float scans: gray
        return np.repeat(grayscale(image)[..., None], 3, axis=-1)
    if image.mode in ("RGBA", "LA", "PA") or "transparency" in image.info:
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        image = Image.alpha_composite(white, rgba)
    return np.asarray(image.convert("RGB"), np.float32)


def pixels(image: Image.Image, channels: int) -> np.ndarray:
    """float32 in [0, 255]: (H, W) luminance for one channel, (H, W, 3) RGB for three."""
    return grayscale(image) if channels == 1 else rgb(image)


def _channels(image_shape) -> int:
    return image_shape[2] if len(image_shape) == 3 else 1


def _strength(ink: np.ndarray) -> np.ndarray:
    """(H, W): how much ink each pixel holds (its brightest channel, for colour)."""
    return ink if ink.ndim == 2 else ink.max(axis=-1)


def _shrink(image: Image.Image, field: int) -> Image.Image:
    limit = max(WORKING_SIZE, 2 * field)
    if max(image.size) <= limit:
        return image
    image = image.copy()
    image.thumbnail((limit, limit), Image.Resampling.BOX)
    return image


def ink_on_black(values: np.ndarray) -> np.ndarray:
    """float32 (H, W) or (H, W, 3) in [0, 1], ink bright on black, the brightest ink at 1.

    Grayscale: inverted if the border is light (dark ink on light paper: MNIST is the
    other way round), then the background level (the border's median) removed. Colour
    keeps the ink's colours: on dark paper the paper's colour is subtracted; on light
    paper each pixel is weighted by how far its colour is from the paper's, so the paper
    turns black and a red pen stays red (black ink on white is then black on black, as a
    colour dataset of objects on black would hold it)."""
    border = np.concatenate([values[0], values[-1], values[:, 0], values[:, -1]])
    if values.ndim == 2:
        if np.median(border) > 127.5:
            values = 255.0 - values
            border = 255.0 - border
        ink = np.clip(values - np.median(border), 0.0, None)
    else:
        paper = np.median(border, axis=0)
        if paper @ LUMA > 127.5:
            away = np.linalg.norm(values - paper, axis=-1, keepdims=True)
            ink = values * (away / away.max()) if away.max() > 0 else np.zeros_like(values)
        else:
            ink = np.clip(values - paper, 0.0, None)
    top = ink.max()
    return ink / top if top > 0 else ink


def _normalise(image: Image.Image, image_shape, by_mass: bool) -> np.ndarray:
    """uint8 `image_shape`: the ink cropped, scaled to fit MNIST's box (`by_mass`) or the
    whole field keeping its aspect ratio, and placed so its centre of mass (`by_mass`) or
    its middle is at the centre. No ink: all black."""
    height, width = image_shape[:2]
    ink = ink_on_black(pixels(_shrink(image, max(height, width)), _channels(image_shape)))
    mask = _strength(ink) > INK
    rows, cols = np.flatnonzero(mask.any(1)), np.flatnonzero(mask.any(0))
    out = np.zeros(image_shape, np.uint8)
    if not len(rows):
        return out
    crop = ink[rows[0] : rows[-1] + 1, cols[0] : cols[-1] + 1]
    h, w = crop.shape[:2]
    if by_mass:
        box = (MNIST_BOX * height / MNIST_FIELD, MNIST_BOX * width / MNIST_FIELD)
        centre = (MNIST_CENTRE * height / MNIST_FIELD, MNIST_CENTRE * width / MNIST_FIELD)
    else:
        box, centre = (height, width), ((height - 1) / 2, (width - 1) / 2)
    scale = min(box[0] / h, box[1] / w)
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
        from scipy import ndimage  # here: the report's child imports this module to draw

        cy, cx = ndimage.center_of_mass(_strength(small).astype(np.float64))
    else:
        cy, cx = (small.shape[0] - 1) / 2, (small.shape[1] - 1) / 2
    # Whole-pixel shifts keep the strokes sharp; the box stays inside the field.
    top = int(np.clip(round(centre[0] - cy), 0, height - small.shape[0]))
    left = int(np.clip(round(centre[1] - cx), 0, width - small.shape[1]))
    out[top : top + small.shape[0], left : left + small.shape[1]] = small
    return out


def mnist_style(image: Image.Image, image_shape=MNIST.image_shape) -> np.ndarray:
    """uint8 `image_shape`: `image` made the way MNIST digits were (see the module
    docstring): in a 28x28 field, longer side 20 px, centre of mass at (14, 14). Blank
    paper comes back all black."""
    return _normalise(image, image_shape, by_mass=True)


def fashion_style(image: Image.Image, image_shape=FASHION_MNIST.image_shape) -> np.ndarray:
    """uint8 `image_shape`: `image` made the way Fashion-MNIST's product photos were (Xiao
    et al. 2017): trimmed to the product, longer side the field's, centred, light
    background turned black."""
    return _normalise(image, image_shape, by_mass=False)


def resized(image: Image.Image, image_shape) -> np.ndarray:
    """uint8 `image_shape`: the whole image resized to the field (no inversion, cropping or
    centring)."""
    height, width = image_shape[:2]
    values = np.round(pixels(image, _channels(image_shape))).astype(np.uint8)
    return np.asarray(Image.fromarray(values).resize((width, height), Image.Resampling.LANCZOS))


STYLES = {"mnist": mnist_style, "fashion": fashion_style, "none": resized}
"""The function for each `DatasetSpec.preprocessing`."""


def style_for(dataset: str | DatasetSpec) -> Callable[[Image.Image], np.ndarray]:
    """`Image -> uint8 spec.image_shape`: the preprocessing that made `dataset`'s images."""
    spec = get_spec(dataset)
    return partial(STYLES[spec.preprocessing], image_shape=spec.image_shape)


def _pixel(y: float, x: float) -> str:
    return f"({y:g}, {x:g})"


def describe(dataset: str | DatasetSpec) -> dict[str, str]:
    """How a person's image becomes one of `dataset`'s inputs, in words: `scaling` (what the
    pixel values mean) and `preprocessing` (what `style_for` does); export's header."""
    spec = get_spec(dataset)
    field = f"the {spec.describe_shape()} field"
    if spec.preprocessing == "mnist":
        h, w = spec.height / MNIST_FIELD, spec.width / MNIST_FIELD
        return {
            "scaling": "0 = black background .. 255 = white ink; the model divides by 255",
            "preprocessing": f"as MNIST: longer side of the ink scaled to {MNIST_BOX * h:g} px, "
            f"centre of mass at pixel {_pixel(MNIST_CENTRE * h, MNIST_CENTRE * w)} of {field}",
        }
    if spec.preprocessing == "fashion":
        return {
            "scaling": "0 = black background .. 255 = the brightest; the model divides by 255",
            "preprocessing": "as Fashion-MNIST: trimmed to the object, light background "
            f"turned black, longer side scaled to fill {field}, centred",
        }
    return {
        "scaling": "0 .. 255 as the dataset's images; the model divides by 255",
        "preprocessing": f"none: the whole image resized to {field}",
    }


def as_is(image: Image.Image, name: str = "image", image_shape=MNIST.image_shape) -> np.ndarray:
    """uint8 `image_shape`: an image of exactly the field's size, its pixels unchanged (no
    inversion, no cropping); DataError for any other size."""
    height, width = image_shape[:2]
    if image.size != (width, height):
        raise DataError(
            f"{name}: is {image.width}x{image.height}; without preprocessing it must be "
            f"{width}x{height}"
        )
    return np.round(pixels(image, _channels(image_shape))).astype(np.uint8)


def image_to_model_input(
    data: bytes,
    name: str = "image",
    preprocess: bool = True,
    dataset: str | DatasetSpec = "mnist",
    max_pixels: int | None = None,
) -> np.ndarray:
    """uint8 `spec.image_shape` from the bytes of an image file, made like `dataset`'s
    images (or as it is, when not `preprocess`); DataError if unusable, ImageTooLarge
    if it declares more than `max_pixels` (None: Pillow's own limit)."""
    spec = get_spec(dataset)
    image = decode_image(data, name, max_pixels)
    if spec.channels not in (1, 3):
        raise DataError(
            f"{name}: {spec.display_name}'s images have {spec.channels} channels, which no "
            "image file gives; pass them as a .npy array"
        )
    return style_for(spec)(image) if preprocess else as_is(image, name, spec.image_shape)


def as_model_input(array, name: str = "array", image_shape=None) -> np.ndarray:
    """uint8 (N, *image_shape) from an array already in the model's format: a batch
    (N, *image_shape) or one image `image_shape`, uint8, or float in [0, 1] (scaled by 255
    and rounded). `image_shape` None takes any batch (N, H, W) or (N, H, W, C), or one
    (H, W) image: the report's grids. DataError otherwise."""
    a = np.asarray(array)
    if image_shape is None:
        batch = a[None] if a.ndim == 2 else a
        if batch.ndim not in (3, 4):
            raise DataError(f"{name}: shape {a.shape}, expected (N, H, W) or (N, H, W, C)")
    else:
        shape = tuple(image_shape)
        batch = a[None] if a.shape == shape else a
        if batch.shape[1:] != shape:
            dims = ", ".join(map(str, shape))
            raise DataError(f"{name}: shape {a.shape}, expected (N, {dims}) or ({dims})")
    a = batch
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


NO_INK = "no ink after preprocessing"


def has_ink(image_u8: np.ndarray) -> bool:
    """Whether a model input has any pixel that is not black. A blank page, white ink on
    a transparent background and an all-zero array all end black, and a model still
    names a class for them: the caller says so rather than pass the guess off as a reading."""
    return bool(np.any(image_u8))


def to_png(image_u8: np.ndarray) -> bytes:
    """PNG bytes of one uint8 (H, W) or (H, W, 3) image, pixel for pixel."""
    buf = io.BytesIO()
    Image.fromarray(np.asarray(image_u8, np.uint8)).save(buf, format="PNG")
    return buf.getvalue()
