"""How many of an ensemble's members run at once when a run is used: all of them, unless
the device's memory needs them in chunks, as training cuts a population into chunks.

`eval`, `predict`, `export` and `serve` use a run of several seeds as the ensemble of its
members. Its program holds every member's activations at once; for a large ensemble at a
large batch that can be more than the device has. `fewest_chunks` compiles the program
for 1, 2, ... chunks (divisors of the member count, so the chunks are equal and a
reshape of the stacked parameters makes them) and keeps the fewest whose memory, as XLA
reports it for the compiled program (`memory_analysis`), fits the budget: the run's
`memory_budget_mb`, or `--memory-budget-mb`, else the device's free memory
(`training.memory.device_budget`). The chunks run one after another and their
probabilities add (`models.ensemble.ensemble_log_probs`; `training.evaluate` for eval),
so the ensemble's predictions are the same, to float32 rounding, in any number of chunks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from jaxmnist.errors import ConfigError
from jaxmnist.training.memory import MB, device_budget


def budget(cfg, memory_budget_mb: int | None = None) -> tuple[int | None, str]:
    """(bytes an ensemble may use, where the figure comes from): `memory_budget_mb` when
    given (`--memory-budget-mb`), else the run's `memory_budget_mb`, else the device's."""
    if memory_budget_mb is not None:
        if memory_budget_mb <= 0:
            raise ConfigError(f"--memory-budget-mb must be positive, got {memory_budget_mb}")
        cfg = dataclasses.replace(cfg, memory_budget_mb=memory_budget_mb)
    return device_budget(cfg)


def program_bytes(compiled) -> int:
    """What a compiled program holds while it runs, as XLA reports it: its arguments,
    outputs and temporaries (outputs that reuse an argument's buffer counted once); 0
    where the backend does not say."""
    analysis = compiled.memory_analysis()
    if analysis is None:
        return 0
    return (
        analysis.argument_size_in_bytes
        + analysis.output_size_in_bytes
        + analysis.temp_size_in_bytes
        - analysis.alias_size_in_bytes
    )


def fewest_chunks(
    members: int, footprint: Callable[[int], int], budget: int | None, source: str
) -> int:
    """The fewest chunks, a divisor of `members`, whose program fits `budget` bytes
    (`footprint(chunks)`: its bytes in that many chunks); 1 when the budget is unknown.
    ConfigError (one line) when even one member at a time does not fit."""
    need = 0
    for chunks in (c for c in range(1, members + 1) if members % c == 0):
        need = footprint(chunks)
        if budget is None or need <= budget:
            return chunks
    raise ConfigError(
        f"the ensemble of {members} members needs about {need / MB:,.0f} MB even one member "
        f"at a time, but {source} is {budget / MB:,.0f} MB; use one member (--member I), a "
        "smaller batch, or a larger --memory-budget-mb"
    )
