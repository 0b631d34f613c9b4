"""What each operation of a compiled training step is: a matmul, a convolution, ...

A profiler trace names the operations it timed by their HLO instruction names
(`dot.12`, `multiply_add_fusion.6`, `ynn_fusion.3`; on a GPU the kernel's `hlo_op`).
A name alone rarely says what an instruction computes, so the optimized HLO
module the step was compiled to (`Compiled.as_text()`) is read once into an
index of every instruction: its opcode, the custom-call target, the computations
it calls (a fusion's body) and the source files on the Python stack that made it
(the module's `StackFrames` table). `classify` then gives each instruction one kind:

    conv_onednn   a custom call to the oneDNN convolution (`models/onednn.py`)
    pool_onednn   a custom call to oneDNN's max-pooling beside it
    conv_xla      XLA's `convolution` (or cuDNN's custom call on a GPU); one without
                  spatial dimensions is a matmul (XLA:TPU writes its dots so)
    conv_im2col   a dot made by `models/conv.py` (im2col, patches)
    matmul        any other dot (or a cuBLAS gemm)
    optimizer     the optimizer's update: work whose stack passes through Optax's
                  transforms (not its losses) or `jaxmnist/optim.py`
    copies        copies, layout changes, gathers and transfers, collectives
    elementwise   other fusions and elementwise or reduction work
    other         what none of these describe (sort, random bits, unknown custom calls)

Instructions that only hold others (`while`, `conditional`, `call`, tuples) get
None: their bodies' operations are timed themselves.
"""

from __future__ import annotations

import re
from typing import NamedTuple

KINDS = (
    "matmul",
    "conv_xla",
    "conv_im2col",
    "conv_onednn",
    "pool_onednn",
    "elementwise",
    "optimizer",
    "copies",
    "other",
)
ARITHMETIC = ("matmul", "conv_xla", "conv_im2col", "conv_onednn")
LABELS = {
    "matmul": "matrix multiplies",
    "conv_xla": "convolutions (XLA)",
    "conv_im2col": "convolutions (im2col)",
    "conv_onednn": "convolutions (oneDNN custom call)",
    "pool_onednn": "max-pooling (oneDNN custom call)",
    "elementwise": "elementwise and reductions",
    "optimizer": "optimizer update",
    "copies": "copies and transfers",
    "other": "other device work",
}

TRANSFER = re.compile(r"memcpy|memset|transfer", re.IGNORECASE)  # a device's copies, by name
# models/onednn.py's FFI targets start so: its convolutions' and its poolings'.
ONEDNN_PREFIX, ONEDNN_POOL_PREFIX = "jaxmnist_onednn_conv", "jaxmnist_onednn_pool"
CONV_TARGET = re.compile(r"cudnn\$conv", re.IGNORECASE)
GEMM_TARGET = re.compile(r"cublas|gemm|matmul", re.IGNORECASE)
CONTAINERS = {
    "while",
    "conditional",
    "call",
    "tuple",
    "get-tuple-element",
    "parameter",
    "constant",
    "bitcast",
    "after-all",
    "opt-barrier",
}
DATA_MOVEMENT = {
    "copy",
    "copy-start",
    "copy-done",
    "transpose",
    "reshape",
    "bitcast",
    "slice",
    "dynamic-slice",
    "dynamic-update-slice",
    "concatenate",
    "pad",
    "gather",
    "scatter",
    "send",
    "send-done",
    "recv",
    "recv-done",
    "infeed",
    "outfeed",
}
COLLECTIVE = re.compile(r"^(all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)")
OTHER = {"sort", "rng", "rng-bit-generator", "rng-get-and-update-state", "custom-call", "fft"}

# "%name = type opcode(" with an optional ROOT; a type may be a tuple holding spaces.
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*?)\s([a-z][\w\-]*)\(")
_ARRAY = re.compile(r"^[a-z]\w*\[([\d,]*)\]")  # an array type's dimensions: f32[256,128]{1,0}
_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")  # unindented
_CALLS = re.compile(r"\bcalls=(?:\{([^}]*)\}|(%?[\w.\-]+))")
_TARGET = re.compile(r'custom_call_target="([^"]*)"')
_FRAME = re.compile(r"\bstack_frame_id=(\d+)")
_SOURCE = re.compile(r'\bsource_file="([^"]*)"')
_TABLE_ROW = re.compile(r"^(\d+)\s+(.*)$")
_FIELD = re.compile(r"(\w+)=(\d+)")
_DIM_LABELS = re.compile(r"\bdim_labels=(\w+->\w+)")


class OpEvent(NamedTuple):
    """An operation as the trace timed it."""

    name: str  # the HLO instruction (or the copy) it ran
    start_ns: int
    end_ns: int
    # An asynchronous operation's time in flight (a TPU's "Async XLA Ops" line): it
    # overlaps the device's other work, and counts only where none runs.
    in_flight: bool = False


class Instruction(NamedTuple):
    opcode: str
    target: str  # custom_call_target, "" when none
    calls: tuple[str, ...]  # called computations (a fusion's body)
    sources: tuple[str, ...]  # source files on its stack, innermost first
    shape: tuple[int, ...] | None = None  # its result's dimensions; None: not an array
    first: tuple[int, ...] | None = None  # those of its result's first array (a tuple's too)
    operands: tuple[str, ...] = ()  # the instructions it reads, by name
    attributes: str = ""  # what follows its operands (dimension numbers, layouts, ...)


class HloIndex(NamedTuple):
    """Every instruction of one or more HLO modules, by name, and each computation's."""

    instructions: dict  # name -> Instruction
    computations: dict  # name -> list of instruction names

    def kind(self, name: str) -> str | None:
        """The kind of the operation `name`: an instruction's (None for a container), or
        copies for a device's memory copy the modules do not name; None for anything else."""
        if name not in self.instructions:
            return "copies" if TRANSFER.search(name) else None
        return classify(name, self)


def read_hlo(*texts: str) -> HloIndex:
    """Indexes the optimized HLO text of one or more modules (the first wins a name twice)."""
    instructions: dict = {}
    computations: dict = {}
    for text in texts:
        tables, body = _tables(text)
        frames = _frame_files(tables)
        current = None
        for line in body:
            m = _INSTRUCTION.match(line)
            if m and current is not None:
                name, result, opcode = m.groups()
                operands, attributes = _operands(line, m.end())
                calls = _CALLS.search(line)
                target = _TARGET.search(line)
                frame = _FRAME.search(line)
                source = _SOURCE.search(line)
                sources = frames.get(int(frame.group(1)), ()) if frame else ()
                if source:
                    sources = (source.group(1), *sources)
                called = calls.group(calls.lastindex).split(",") if calls else ()
                called = tuple(c.strip().lstrip("%") for c in called)
                computations[current].append(name)
                shape, first = _dims(result), _dims(result.lstrip("("))
                instructions.setdefault(
                    name,
                    Instruction(
                        opcode,
                        target.group(1) if target else "",
                        called,
                        sources,
                        shape,
                        first,
                        operands,
                        attributes,
                    ),
                )
                continue
            c = _COMPUTATION.match(line)
            if c and not line[:1].isspace():
                current = c.group(1)
                computations.setdefault(current, [])
            elif line.startswith("}"):
                current = None
    return HloIndex(instructions, computations)


def _dims(text: str) -> tuple[int, ...] | None:
    """The dimensions of the array type `text` begins with, or None."""
    array = _ARRAY.match(text)
    return tuple(int(d) for d in array.group(1).split(",") if d) if array else None


def _operands(line: str, start: int) -> tuple[tuple[str, ...], str]:
    """The operand names of the instruction whose operand list opens at `line[start]`
    (each printed as `%name`, or `type %name`), and the text after the list."""
    depth, end = 1, start
    while end < len(line) and depth:
        depth += {"(": 1, ")": -1}.get(line[end], 0)
        end += 1
    names, part, depth = [], [], 0
    for ch in line[start : end - 1] + ",":
        depth += {"(": 1, "[": 1, "{": 1, ")": -1, "]": -1, "}": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            token = "".join(part).split()
            if token:
                names.append(token[-1].lstrip("%"))
            part = []
        else:
            part.append(ch)
    return tuple(names), line[end:]


def _tables(text: str) -> tuple[dict, list[str]]:
    """The module's FileNames, FileLocations and StackFrames tables, and its other lines."""
    tables: dict = {}
    body, table = [], None
    for line in text.splitlines():
        if line in ("FileNames", "FunctionNames", "FileLocations", "StackFrames"):
            table = tables.setdefault(line, {})
            continue
        row = _TABLE_ROW.match(line) if table is not None else None
        if row:
            table[int(row.group(1))] = row.group(2)
            continue
        table = None
        body.append(line)
    return tables, body


def _frame_files(tables: dict) -> dict[int, tuple[str, ...]]:
    """Stack frame id -> the source files of its stack, innermost first."""
    names = {i: v.strip('"') for i, v in tables.get("FileNames", {}).items()}
    locations = {
        i: {k: int(v) for k, v in _FIELD.findall(v)}
        for i, v in tables.get("FileLocations", {}).items()
    }
    frames = {
        i: {k: int(v) for k, v in _FIELD.findall(v)}
        for i, v in tables.get("StackFrames", {}).items()
    }
    # XLA prints a frame's parent one above its id (the root frames name themselves):
    # where any frame names itself, every parent is read one lower.
    shift = int(any(f.get("parent_frame_id") == i for i, f in frames.items()))
    out: dict[int, tuple[str, ...]] = {}
    for start in frames:
        files, i, seen = [], start, set()
        while i in frames and i not in seen:
            seen.add(i)
            location = locations.get(frames[i].get("file_location_id", 0), {})
            files.append(names.get(location.get("file_name_id", 0), ""))
            i = frames[i].get("parent_frame_id", 0) - shift
        out[start] = tuple(files)
    return out


def _is_optimizer(source: str) -> bool:
    s = source.replace("\\", "/")
    return ("/optax/" in s and "/optax/losses/" not in s) or s.endswith("jaxmnist/optim.py")


def _is_conv_module(source: str) -> bool:
    return source.replace("\\", "/").endswith("jaxmnist/models/conv.py")


def operations(name: str, index: HloIndex) -> list[tuple[str, Instruction]]:
    """Instruction `name` and, recursively, every instruction of what it calls (a
    fusion's body), each once."""
    return _ops(name, index, set())


def _ops(name: str, index: HloIndex, seen: set) -> list[tuple[str, Instruction]]:
    if name in seen or name not in index.instructions:
        return []
    seen.add(name)
    ins = index.instructions[name]
    out = [(name, ins)]
    for comp in ins.calls:
        for inner in index.computations.get(comp, ()):
            out += _ops(inner, index, seen)
    return out


def _is_matmul(ins: Instruction) -> bool:
    """Whether a `convolution` is a matmul: one with no spatial dimensions (`dim_labels`
    such as `bf_io->bf`), which is how XLA:TPU writes every dot in optimized HLO."""
    labels = _DIM_LABELS.search(ins.attributes)
    return labels is not None and not any(c.isdigit() for c in labels.group(1))


def classify(name: str, index: HloIndex) -> str | None:
    """The kind (one of KINDS) of instruction `name`, or None for a container."""
    top = index.instructions[name]
    if top.opcode in CONTAINERS:
        return None
    ops = operations(name, index)
    opcodes = {ins.opcode for _, ins in ops}
    targets = [ins.target for _, ins in ops if ins.opcode == "custom-call"]
    sources = {s for _, ins in ops for s in ins.sources}
    if any(t.startswith(ONEDNN_PREFIX) for t in targets):
        return "conv_onednn"
    if any(t.startswith(ONEDNN_POOL_PREFIX) for t in targets):
        return "pool_onednn"
    convs = [ins for _, ins in ops if ins.opcode == "convolution"]
    if any(not _is_matmul(ins) for ins in convs) or any(CONV_TARGET.search(t) for t in targets):
        return "conv_xla"
    if convs or "dot" in opcodes or any(GEMM_TARGET.search(t) for t in targets):
        dots = [ins for _, ins in ops if ins.opcode in ("dot", "custom-call", "convolution")]
        if any(_is_conv_module(s) for ins in dots for s in ins.sources):
            return "conv_im2col"
        return "matmul"
    if any(_is_optimizer(s) for s in sources):
        return "optimizer"
    work = {op for op in opcodes if op not in CONTAINERS | {"fusion"}}
    if COLLECTIVE.match(top.opcode) or (work and work <= DATA_MOVEMENT):
        return "copies"
    return "other" if top.opcode in OTHER else "elementwise"
