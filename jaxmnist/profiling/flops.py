"""The arithmetic an operation of a compiled step performs, counted from its HLO.

The model family's analytic count (`flops_per_example`, the figure `jaxmnist bench`
uses for MFU) covers a whole step, so it cannot say how fast the convolutions ran
apart from the dense layers. The optimized HLO can: every instruction that does
arithmetic says its shapes, so its FLOPs follow (a multiply and an add per term,
as everywhere in jaxmnist):

    dot           2 x the result's elements x the lhs's contracting dimensions
    convolution   2 x the result's elements x the kernel's elements per output feature
    cuBLAS GEMM   a dot, its dimension numbers in its backend config (a GPU's matmuls;
                  the result a tuple whose first array is the product)
    oneDNN calls  the same convolution for each of the three (`models/onednn.py`):
                  forward, input gradient, weight gradient, on NHWC activations and
                  HWIO kernels, behind any leading (vmapped) dimensions

A fusion performs what its body does (a GPU's Triton GEMMs are fusions around a
dot). What this cannot count (XLA's convolutions with `batch_group_count`, cuDNN's
convolution calls, a GEMM call without dimension numbers) is None, and so is
anything that holds one: a figure is never a guess. Elementwise work is
not counted: the table gives FLOP/s for the matmuls and convolutions only.
"""

from __future__ import annotations

import math
import re

from jaxmnist.profiling.classify import (
    CONV_TARGET,
    GEMM_TARGET,
    ONEDNN_PREFIX,
    HloIndex,
    operations,
)

_CONTRACTING = re.compile(r"\blhs_contracting_dims=\{([\d,]*)\}")
_DIM_LABELS = re.compile(r"\bdim_labels=\w+_(\w+)->")
_BATCH_GROUPS = re.compile(r"\bbatch_group_count=(\d+)")
# In a GEMM call's backend config (JSON, printed quoted or not): "lhs_contracting_dimensions":["1"]
_GEMM_CONTRACTING = re.compile(r'\\?"?lhs_contracting_dimensions\\?"?:\[([^\]]*)\]')


def count(name: str, index: HloIndex) -> float | None:
    """FLOPs of one execution of instruction `name`, with whatever it calls; 0 for one
    that does no matmul or convolution; None where one of them cannot be counted."""
    each = [_own(ins, index) for _, ins in operations(name, index)]
    return None if None in each else float(sum(each))


def _shape(name: str, index: HloIndex) -> tuple[int, ...] | None:
    ins = index.instructions.get(name)
    return ins.shape if ins else None


def _own(ins, index: HloIndex) -> float | None:
    """The instruction's own FLOPs, not its called computations'."""
    if ins.opcode == "dot":
        return _dot(ins.shape, ins, _CONTRACTING, index)
    if ins.opcode == "convolution":
        kernel = _shape(ins.operands[1], index) if len(ins.operands) > 1 else None
        labels = _DIM_LABELS.search(ins.attributes)
        groups = _BATCH_GROUPS.search(ins.attributes)
        if ins.shape is None or kernel is None or labels is None or (groups and groups[1] != "1"):
            return None
        if "o" not in labels.group(1) or len(labels.group(1)) != len(kernel):
            return None
        per_output = math.prod(kernel) // kernel[labels.group(1).index("o")]
        return 2.0 * math.prod(ins.shape) * per_output
    if ins.opcode == "custom-call":
        if ins.target.startswith(ONEDNN_PREFIX):
            return _onednn(ins, index)
        if GEMM_TARGET.search(ins.target):
            return _dot(ins.first, ins, _GEMM_CONTRACTING, index)
        if CONV_TARGET.search(ins.target):
            return None
    return 0.0


def _dot(out: tuple[int, ...] | None, ins, contracting: re.Pattern, index) -> float | None:
    """2 x the product's elements x the lhs's contracted length."""
    lhs = _shape(ins.operands[0], index) if ins.operands else None
    dims = contracting.search(ins.attributes)
    if out is None or lhs is None or dims is None:
        return None
    contracted = [int(d.strip('\\" ')) for d in dims.group(1).split(",") if d.strip('\\" ')]
    if any(d >= len(lhs) for d in contracted):
        return None
    return 2.0 * math.prod(out) * math.prod(lhs[d] for d in contracted)


def _onednn(ins, index: HloIndex) -> float | None:
    """A oneDNN convolution call: 2 x the forward output's elements x kh*kw*Cin."""
    shapes = [_shape(o, index) for o in ins.operands[:2]]
    if ins.shape is None or len(shapes) < 2 or None in shapes:
        return None
    a, b = shapes
    if ins.target.endswith("_forward"):  # (x, kernel) -> y
        y, kernel = ins.shape, b
    elif ins.target.endswith("_backward_data"):  # (dy, kernel) -> dx
        y, kernel = a, b
    elif ins.target.endswith("_backward_weights"):  # (x, dy) -> dkernel
        y, kernel = b, ins.shape
    else:
        return None
    if len(kernel) < 4:
        return None
    return 2.0 * math.prod(y) * math.prod(kernel[-4:-1])
