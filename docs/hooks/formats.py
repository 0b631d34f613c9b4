"""How the Results page writes a record's values: percentages, seconds, ratios, sizes.

The readers of `figures_model` and `figures_run` format every figure through these, so
that a value reads the same in every benchmark's section.
"""

from __future__ import annotations


def pct(x: float, digits: int = 2) -> str:
    return f"{x:.{digits}%}"


def sec(x: float, digits: int = 2) -> str:
    return f"{x:.{digits}f} s"


def ms(x: float, digits: int = 1) -> str:
    return f"{x:,.{digits}f} ms"


def us(x: float) -> str:
    return f"{x:,.1f} µs"


def ratio(x: float, digits: int = 2) -> str:
    return f"{x:.{digits}f}×"


def mb(x: float) -> str:
    return f"{x:,.0f} MB"


def rate(x: float) -> str:
    return f"{x:,.0f}"


def ci(pair) -> str:
    return f"95% CI {pct(pair[0])}–{pct(pair[1])}" if pair else "no CI"


def met(ok: bool) -> str:
    return "met" if ok else "**missed**"


def plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def copy(key: str, copies: list[str]) -> str:
    """A copy of the code a script ran side by side (`this`, `pythonpath:DIR`), named
    without the folder it was in (the record says what each was)."""
    if key == "this":
        return "this checkout"
    others = [k for k in copies if k != "this"]
    return "the other copy" + (f" ({others.index(key) + 1})" if len(others) > 1 else "")


def range_of(xs) -> str:
    return f"{min(xs):.2f}–{max(xs):.2f}"
