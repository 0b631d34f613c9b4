"""2-D convolution and max-pooling for the CNN, in several formulations, and the choice
among them per backend.

Every convolution here is the same function: stride 1, "SAME" zero padding, an odd square
kernel, NHWC activations `x (B, H, W, C)` and HWIO weights `w (k, k, C, O)` -> `(B, H, W, O)`,
computed in the dtype of its inputs. They differ only in how XLA is asked to compute it:

- `xla`: `lax.conv_general_dilated`, XLA's native convolution. On GPU and TPU this is
  cuDNN's or the TPU's own convolution and nothing beats it; on CPU XLA lowers it to a
  generic loop that trains the reference CNN about 10-20 times slower than `im2col`.
- `im2col`: the k² shifted views of the padded input, concatenated along channels into
  patches (B, H, W, k²·C), and one matmul with the weights reshaped to (k²·C, O). The
  matmul goes to XLA's CPU GEMM library (YNNPACK) and the shifts fuse into one copy;
  autodiff turns the slices into pads, so the backward pass is two matmuls and one fused
  sum. A hand-written VJP (the input gradient as im2col of the output gradient with the
  flipped kernel, or recomputed patches) measured no faster, so there is none.
- `patches`: `lax.conv_general_dilated_patches` + one matmul: the same algorithm with
  XLA's own patch extraction, which it lowers as a convolution with a one-hot kernel
  (about twice as slow as the slices on CPU; kept as a measured alternative).

XLA's CPU backend converts bfloat16 matmul operands to float32 before its GEMM, so on CPU
bfloat16 saves memory traffic but no arithmetic (no AVX512-BF16 or AMX instructions).

`auto` is XLA's convolution on accelerators and the fastest measured formulation on CPU
(`CPU_FASTEST`, from `benchmarks/cnn_vs_pytorch.py`). Pooling is a reshape and a max over
the 2×2 windows, which XLA fuses with the bias and activation before it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

_DIMS = ("NHWC", "HWIO", "NHWC")


def conv_xla(x: jax.Array, w: jax.Array) -> jax.Array:
    """XLA's native convolution. x (B, H, W, C), w (k, k, C, O) -> (B, H, W, O)."""
    return lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=_DIMS)


def shifted_views(x: jax.Array, k: int) -> list[jax.Array]:
    """The k² views x[:, i:i+H, j:j+W] of x zero-padded by k // 2, row-major over (i, j)."""
    p = k // 2
    _, h, w, _ = x.shape
    xp = jnp.pad(x, ((0, 0), (p, p), (p, p), (0, 0)))
    return [xp[:, i : i + h, j : j + w, :] for i in range(k) for j in range(k)]


def conv_im2col(x: jax.Array, w: jax.Array) -> jax.Array:
    """im2col by shifted slices + one matmul. x (B, H, W, C), w (k, k, C, O) -> (B, H, W, O).

    Patch channel order is (i, j, c), matching the row-major reshape of HWIO weights.
    """
    k, _, c, o = w.shape
    patches = jnp.concatenate(shifted_views(x, k), axis=-1)  # (B, H, W, k*k*C)
    return patches @ w.reshape(k * k * c, o)


def conv_patches(x: jax.Array, w: jax.Array) -> jax.Array:
    """`conv_general_dilated_patches` + one matmul. x (B, H, W, C), w (k, k, C, O)."""
    k, _, c, o = w.shape
    patches = lax.conv_general_dilated_patches(x, (k, k), (1, 1), "SAME", dimension_numbers=_DIMS)
    # Its patch features are ordered (c, i, j): channel-major, unlike the slices above.
    return patches @ jnp.transpose(w, (2, 0, 1, 3)).reshape(c * k * k, o)


CONV_IMPLS = {"xla": conv_xla, "im2col": conv_im2col, "patches": conv_patches}
CHOICES = ("auto", *CONV_IMPLS)
# The fastest formulation measured on CPU (see the module docstring).
CPU_FASTEST = "im2col"


def resolve(impl: str, backend: str | None = None) -> str:
    """The formulation `impl` stands for on `backend` (default: JAX's default backend)."""
    if impl != "auto":
        return impl
    backend = backend or jax.default_backend()
    return CPU_FASTEST if backend == "cpu" else "xla"


def conv2d(x: jax.Array, w: jax.Array, impl: str = "auto") -> jax.Array:
    """SAME, stride-1 convolution by formulation `impl` (auto, xla, im2col, patches)."""
    return CONV_IMPLS[resolve(impl)](x, w)


def max_pool(x: jax.Array, size: int = 2) -> jax.Array:
    """Max over non-overlapping size×size windows; odd edges are dropped (floor, as
    PyTorch's MaxPool2d). x (B, H, W, C) -> (B, H // size, W // size, C)."""
    b, h, w, c = x.shape
    ho, wo = h // size, w // size
    x = x[:, : ho * size, : wo * size, :]
    return x.reshape(b, ho, size, wo, size, c).max(axis=(2, 4))
