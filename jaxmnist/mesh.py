"""The mesh as a config names it: its axes, and the syntax of `--mesh` and `--devices`.

A run's devices form a 2-D mesh with the axes `AXES`: `members` (the models of a
population) and `data` (the global batch); `training.parallel` builds it and places
arrays on it. This module only reads what the config's `parallel` section says, and
imports no jax, so that `config.validate` checks that syntax before anything loads.
"""

from __future__ import annotations

from jaxmnist.errors import ConfigError

AXES = ("members", "data")


def parse_mesh(text: str | None) -> dict[str, int] | None:
    """`members=M,data=D` (either may be left out: 1) -> {"members": M, "data": D}."""
    if text is None or not text.strip():
        return None
    sizes = {}
    for part in text.split(","):
        name, sep, value = part.partition("=")
        name = name.strip()
        if not sep or name not in AXES or not value.strip().isdigit() or int(value) < 1:
            raise ConfigError(f"mesh: expected members=M,data=D with positive sizes, got {text!r}")
        sizes[name] = int(value)
    return {"members": sizes.get("members", 1), "data": sizes.get("data", 1)}


def parse_devices(text: str | int | None) -> int | None:
    """`N` or `all` -> a device count, or None for all devices."""
    if text is None or str(text).strip().lower() == "all":
        return None
    try:
        n = int(text)
    except ValueError:
        raise ConfigError(f"devices: expected a number or 'all', got {text!r}") from None
    if n < 1:
        raise ConfigError(f"devices must be at least 1, got {n}")
    return n
