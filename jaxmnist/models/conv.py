"""2-D convolution and max-pooling for the CNN, in several formulations, and the choice
among them per backend.

Every convolution here is the same function: stride 1, a square kernel, NHWC activations
`x (B, H, W, C)` and HWIO weights `w (k, k, C, O)`, computed in the dtype of its inputs;
"same" zero padding (odd k) keeps `(B, H, W, O)`, "valid" (no padding) gives
`(B, H-k+1, W-k+1, O)`. They differ only in how XLA is asked to compute it:

- `xla`: `lax.conv_general_dilated`, XLA's native convolution: cuDNN's or the TPU's own
  on accelerators, where nothing beats it; on CPU a generic loop, far slower than a matmul.
- `im2col`: the k² shifted views of the padded input, concatenated along channels into
  patches (B, H, W, k²·C), and one matmul with the weights reshaped to (k²·C, O): XLA's
  CPU GEMM library does the work and the shifts fuse into one copy. Its VJP is written out
  (the weight gradient one matmul of the saved patches, the input gradient folded back by
  the transpose of the patch extraction) because under autodiff XLA:CPU first writes the
  output gradient out transposed; `im2col_autodiff` keeps autodiff's, to compare
  (`benchmarks/conv_backward.py`, in the history at 4b115f5: docs/results.md, "Decided").
- `patches`: `lax.conv_general_dilated_patches` + one matmul: the same algorithm with
  XLA's own patch extraction (a convolution with a one-hot kernel), kept to compare.
- `banded`: each output row as one matmul of the k input rows it reads, (B·H', k·W·C),
  with a banded matrix made from the weights, (k·W·C, W'·O): k·W·C·W'·O multiply-adds
  per output row where the convolution needs k²·C·W'·O, so W/k times the arithmetic, but
  a matmul whose output is a whole row of channels wide (for a first layer, a patch of k²
  values per pixel is narrower than a TPU's vector lanes).
- `onednn`: oneDNN's direct convolution kernels (PyTorch's on CPU), called from XLA as FFI
  custom calls (`jaxmnist.models.onednn`); CPU only, needs the optional package
  jaxmnist-onednn (compiled when it is installed). They build the patches in registers,
  where im2col writes them to memory.

In bfloat16 every im2col matmul reads bfloat16 and accumulates in float32
(`layers.wide_dot`), and the patches' gradient is folded back in float32. On CPU XLA
widens the backward matmuls (each has a transposed operand) and the ops around them to
float32, so only the forward matmul gains (`benchmarks/bf16_matmul.py`).

`auto` is XLA's convolution on accelerators (but for a grayscale first layer on a TPU:
`banded` or `patches`, `resolve`); on CPU it is `onednn` where that is
available and the process has one device (a custom call is opaque to the partitioner, so
on a mesh it keeps `im2col`, which XLA can shard), else `im2col`: the fastest of these on
CPU, in that order. Pooling is a max over the windows' strided views, which XLA fuses
with what comes before and after it. Its VJP is written out: the forward pass keeps which
element of each window was the maximum (the first, in row-major order, where several tie:
the element `lax.reduce_window`'s gradient and PyTorch's pick) as one byte, and the
backward pass sends each window's gradient there in one elementwise pass. Autodiff of the
max instead compares every element with its window's maximum, counts the ties and divides
the gradient among them: three passes over the convolution's output, a large part of a
CNN step's elementwise time on CPU. Beside oneDNN's convolution, a differentiated pooling
goes through oneDNN's pooling calls instead (`onednn.max_pool_forward`, whose one-byte
workspace names the same element): XLA duplicates cheap elementwise producers into each
of their consumers, so its pooling was computed three times from the convolution's
full-size output (for the activation, the activation's gradient and the pooling's own
gradient), where a custom call is computed once. Without a gradient (evaluation,
prediction) oneDNN pools too, and with ReLU one call pools, adds the bias and rectifies
(`max_pool_bias_relu`), writing the block's output once. The measured comparisons are in
docs/results.md.
"""

from __future__ import annotations

import functools
import logging
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxmnist.models import onednn
from jaxmnist.models.layers import wide_dot

_DIMS = ("NHWC", "HWIO", "NHWC")


PADDINGS = ("same", "valid")


def conv_xla(x: jax.Array, w: jax.Array, padding: str = "same") -> jax.Array:
    """XLA's native convolution. x (B, H, W, C), w (k, k, C, O) -> (B, H', W', O)."""
    return lax.conv_general_dilated(x, w, (1, 1), padding.upper(), dimension_numbers=_DIMS)


def padded(x: jax.Array, k: int, padding: str) -> jax.Array:
    """x (B, H, W, C) zero-padded by k // 2 on each side for "same", as it is for "valid"."""
    if padding != "same":
        return x
    p = k // 2
    return jnp.pad(x, ((0, 0), (p, p), (p, p), (0, 0)))


def shifted_views(x: jax.Array, k: int, padding: str = "same") -> list[jax.Array]:
    """The k² views x[:, i:i+H', j:j+W'] of x (zero-padded by k // 2 for "same"),
    row-major over (i, j)."""
    x = padded(x, k, padding)
    _, h, w, _ = x.shape
    ho, wo = h - k + 1, w - k + 1
    return [x[:, i : i + ho, j : j + wo, :] for i in range(k) for j in range(k)]


def _patches(x: jax.Array, k: int, padding: str) -> jax.Array:
    """(B, H', W', k²·C): patch channel order (i, j, c), matching the row-major reshape
    of HWIO weights."""
    return jnp.concatenate(shifted_views(x, k, padding), axis=-1)


def im2col_autodiff(x: jax.Array, w: jax.Array, padding: str = "same") -> jax.Array:
    """im2col by shifted slices + one matmul, differentiated by autodiff.
    x (B, H, W, C), w (k, k, C, O) -> (B, H', W', O)."""
    k, _, c, o = w.shape
    return _patches(x, k, padding) @ w.reshape(k * k * c, o)


@partial(jax.custom_vjp, nondiff_argnums=(2,))
def _im2col(x: jax.Array, w: jax.Array, padding: str) -> jax.Array:
    return _im2col_fwd(x, w, padding)[0]


def _im2col_fwd(x, w, padding):
    k, _, c, o = w.shape
    patches = _patches(x, k, padding)
    rows = patches.reshape(-1, k * k * c)
    y = wide_dot(rows, w.reshape(k * k * c, o)).astype(x.dtype)
    return y.reshape(*patches.shape[:-1], o), (x, w, patches)


def _im2col_bwd(padding, residuals, g):
    x, w, patches = residuals
    k, _, c, o = w.shape
    g = g.reshape(-1, o)
    dw = wide_dot(patches.reshape(-1, k * k * c).T, g).astype(w.dtype)
    # The patches' gradient in the compute dtype, folded back in float32.
    dpatches = wide_dot(g, w.reshape(k * k * c, o).T).astype(x.dtype)
    wide = jax.ShapeDtypeStruct(x.shape, jnp.float32)
    extract = jax.linear_transpose(lambda v: _patches(v, k, padding), wide)
    (dx,) = extract(dpatches.reshape(patches.shape).astype(jnp.float32))
    return dx.astype(x.dtype), dw.reshape(w.shape)


_im2col.defvjp(_im2col_fwd, _im2col_bwd)


def conv_im2col(x: jax.Array, w: jax.Array, padding: str = "same") -> jax.Array:
    """im2col by shifted slices + one matmul, with the VJP written out (module docstring).
    x (B, H, W, C), w (k, k, C, O) -> (B, H', W', O)."""
    return _im2col(x, w, padding)


def conv_patches(x: jax.Array, w: jax.Array, padding: str = "same") -> jax.Array:
    """`conv_general_dilated_patches` + one matmul. x (B, H, W, C), w (k, k, C, O)."""
    k, _, c, o = w.shape
    patches = lax.conv_general_dilated_patches(
        x, (k, k), (1, 1), padding.upper(), dimension_numbers=_DIMS
    )
    # Its patch features are ordered (c, i, j): channel-major, unlike the slices above.
    return patches @ jnp.transpose(w, (2, 0, 1, 3)).reshape(c * k * k, o)


def conv_banded(x: jax.Array, w: jax.Array, padding: str = "same") -> jax.Array:
    """Each output row as one matmul with a banded matrix (module docstring).
    x (B, H, W, C), w (k, k, C, O) -> (B, H', W', O)."""
    k, _, c, o = w.shape
    x = padded(x, k, padding)
    b, h, width, _ = x.shape
    rows, cols = h - k + 1, width - k + 1
    # The k input rows each output row reads, side by side: (B, H', k·W·C).
    window = jnp.concatenate(
        [x[:, i : i + rows].reshape(b, rows, width * c) for i in range(k)], axis=-1
    )
    # band[i, a, c, z, o] = w[i, a - z, c, o] where 0 <= a - z < k, else 0: a sum of one
    # term or none, so exact in any dtype.
    taps = np.zeros((k, width, cols), np.float32)
    for j in range(k):
        taps[j, np.arange(cols) + j, np.arange(cols)] = 1
    band = jnp.einsum("jaz,ijco->iaczo", jnp.asarray(taps, w.dtype), w)
    y = window @ band.reshape(k * width * c, cols * o)
    return y.reshape(b, rows, cols, o)


CONV_IMPLS = {
    "xla": conv_xla,
    "im2col": conv_im2col,
    "patches": conv_patches,
    "banded": conv_banded,
    "onednn": onednn.conv_onednn,
}
CHOICES = ("auto", *CONV_IMPLS)
# The fastest formulations measured on CPU: with oneDNN, and in plain XLA.
CPU_FASTEST, CPU_FASTEST_XLA = "onednn", "im2col"
# `banded`'s arithmetic over the convolution's, at most, for `auto` to choose it.
BANDED_MAX_WORK = 8
# Formulations that are plain XLA operations: exportable, and shardable by the compiler.
PORTABLE = ("xla", "im2col", "patches", "banded")


def resolve(
    impl: str,
    backend: str | None = None,
    dtype="float32",
    in_channels: int | None = None,
    kernel: int | None = None,
    width: int | None = None,
    padding: str = "same",
) -> str:
    """The formulation `impl` stands for on `backend` (default: JAX's default backend),
    for convolutions in `dtype` of inputs with `in_channels` channels (None: any), and,
    where known, a `kernel`×`kernel` kernel over inputs `width` wide with `padding`.

    On a TPU `auto` is XLA's native convolution, except for an input of one channel (a
    grayscale image's first layer): inside a single model's training steps with augmented
    batches, that one compiled for far longer than the rest of the program together. It
    is `banded` where the band's matmul does at most `BANDED_MAX_WORK` times the
    convolution's arithmetic (the padded width over the kernel's: a 5×5 kernel on MNIST),
    else `patches`; both compile like any other layer, and of the two `banded` trained
    several CNNs' epochs faster with 5×5 kernels, `patches` with 3×3 ones
    (`benchmarks/first_conv.py`, docs/tpu-gpu.md)."""
    if impl != "auto":
        return impl
    backend = backend or jax.default_backend()
    if backend == "tpu" and in_channels == 1:
        if kernel is None or width is None:
            return "patches"
        padded_width = width + (kernel - 1 if padding == "same" else 0)
        return "banded" if padded_width <= BANDED_MAX_WORK * kernel else "patches"
    if backend != "cpu":
        return "xla"
    if jax.device_count() == 1:
        if onednn.supports(dtype):
            return CPU_FASTEST
        if onednn.available():
            _say_fallback(f"oneDNN has no {jnp.dtype(dtype).name} convolution for this CPU")
        elif onednn.load_failed():
            _say_fallback(onednn.unavailable_reason())
    return CPU_FASTEST_XLA


@functools.cache
def _say_fallback(reason: str) -> None:
    """Once per process, as the compilation cache does: the run goes on, only slower."""
    logging.getLogger(__name__).warning("%s; conv_impl=auto uses %s", reason, CPU_FASTEST_XLA)


def portable(impl: str, backend: str | None = None) -> str:
    """`impl`, or where it resolves to a custom call (oneDNN), the fastest plain-XLA
    formulation: for programs that leave this process (`jaxmnist export`)."""
    resolved = resolve(impl, backend)
    return resolved if resolved in PORTABLE else CPU_FASTEST_XLA


def conv2d(x: jax.Array, w: jax.Array, impl: str = "auto", padding: str = "same") -> jax.Array:
    """Stride-1 convolution by formulation `impl` (auto, xla, im2col, patches, onednn), with
    "same" or "valid" padding."""
    return CONV_IMPLS[resolve(impl)](x, w, padding)


def max_pool(x: jax.Array, size: int = 2, impl: str = "xla") -> jax.Array:
    """Max over non-overlapping size×size windows; odd edges are dropped (floor, as
    PyTorch's MaxPool2d). x (B, H, W, C) -> (B, H // size, W // size, C). Its gradient
    goes to each window's first maximum (module docstring). `impl`, the convolution's
    resolved formulation: beside oneDNN's convolution, oneDNN pools too."""
    if impl == "onednn":
        return _onednn_window_max(x, size, x.shape[1:3])
    h, w = x.shape[1] // size * size, x.shape[2] // size * size
    return _window_max(x[:, :h, :w, :], size)


def max_pool_bias_relu(x: jax.Array, b: jax.Array, size: int = 2, impl: str = "xla"):
    """relu(max_pool(x) + b): a conv block's pooling, then its bias and ReLU (both commute
    with the maximum, so this is the activation pooled). Beside oneDNN's convolution one
    oneDNN call does all three as it pools (`onednn.max_pool_bias_relu`), where XLA would
    read and write the pooled map once more for the bias and ReLU; differentiated, the
    call also writes the pooling's workspace, and the gradient is the ReLU's mask, the
    bias's sum and oneDNN's pooling gradient. Either gives the same values as the parts."""
    if impl == "onednn":
        return _onednn_pool_bias_relu(x, b, size, x.shape[1:3])
    return jax.nn.relu(max_pool(x, size, impl) + b)


@partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _onednn_pool_bias_relu(x: jax.Array, b: jax.Array, size: int, edges: tuple[int, int]):
    return onednn.max_pool_bias_relu(x, b, size)


def _onednn_pool_bias_relu_fwd(x: jax.Array, b: jax.Array, size: int, edges: tuple[int, int]):
    out, workspace = onednn.max_pool_bias_relu_forward(x, b, size)
    return out, (out, workspace)


def _onednn_pool_bias_relu_bwd(size: int, edges: tuple[int, int], residuals, g: jax.Array):
    out, workspace = residuals
    g = jnp.where(out > 0, g, jnp.zeros((), g.dtype))  # the ReLU's gradient, as jax.nn.relu's
    # The bias's gradient as autodiff makes it (the transpose of its broadcast: a sum in
    # the bias's dtype, where jnp.sum would accumulate bfloat16 in float32).
    bias = jax.ShapeDtypeStruct(g.shape[-1:], g.dtype)
    (db,) = jax.linear_transpose(lambda b: jnp.broadcast_to(b, g.shape), bias)(g)
    shape = (g.shape[0], *edges, g.shape[3])
    return onednn.max_pool_backward(g, workspace, shape, size), db


_onednn_pool_bias_relu.defvjp(_onednn_pool_bias_relu_fwd, _onednn_pool_bias_relu_bwd)


def _windows(x: jax.Array, size: int) -> jax.Array:
    """x (B, H, W, C) as (B, H/size, size, W/size, size, C): each window's elements."""
    b, h, w, c = x.shape
    return x.reshape(b, h // size, size, w // size, size, c)


@partial(jax.custom_vjp, nondiff_argnums=(1,))
def _window_max(x: jax.Array, size: int) -> jax.Array:
    return _windows(x, size).max(axis=(2, 4))


def _window_max_fwd(x: jax.Array, size: int):
    v = _windows(x, size)
    views = [v[:, :, i, :, j, :] for i in range(size) for j in range(size)]
    top = functools.reduce(jnp.maximum, views)
    index = _index_dtype(size)
    first = jnp.full(top.shape, len(views) - 1, index)  # which view holds the maximum
    for k in reversed(range(len(views) - 1)):  # the lowest index wins a tie
        first = jnp.where(views[k] == top, index(k), first)
    return top, first


def _index_dtype(size: int):
    """A byte per window where it can number the window's elements."""
    return jnp.int8 if size * size <= 127 else jnp.int32


def _window_max_bwd(size: int, first: jax.Array, g: jax.Array):
    b, ho, wo, c = g.shape
    position = jnp.arange(size * size, dtype=_index_dtype(size)).reshape(1, 1, size, 1, size, 1)
    chosen = first[:, :, None, :, None, :] == position
    dx = jnp.where(chosen, g[:, :, None, :, None, :], jnp.zeros((), g.dtype))
    return (dx.reshape(b, ho * size, wo * size, c),)


_window_max.defvjp(_window_max_fwd, _window_max_bwd)


@partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def _onednn_window_max(x: jax.Array, size: int, edges: tuple[int, int]) -> jax.Array:
    """Max-pooling by oneDNN's custom calls, `edges` the map's (H, W). Differentiated, XLA
    would fuse the pooling into each of its consumers (the activation forward, its
    gradient, the pooling's gradient) and recompute it from the convolution's output in
    each; without a gradient (evaluation, prediction) oneDNN's kernel also beats XLA's
    fused max on the presets' maps (`benchmarks/eval_overhead.py`). The maximum is exact,
    so either gives the same values."""
    return onednn.max_pool_forward(x, size)[0]


def _onednn_window_max_fwd(x: jax.Array, size: int, edges: tuple[int, int]):
    return onednn.max_pool_forward(x, size)


def _onednn_window_max_bwd(size: int, edges: tuple[int, int], workspace, g: jax.Array):
    shape = (g.shape[0], *edges, g.shape[3])
    return (onednn.max_pool_backward(g, workspace, shape, size),)


_onednn_window_max.defvjp(_onednn_window_max_fwd, _onednn_window_max_bwd)
