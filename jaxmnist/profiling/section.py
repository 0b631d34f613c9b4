"""The profile's table as an HTML section, for report.html and bench.html.

Both pages are built with `jaxmnist.pages`; this gives them the same
section: the table of kinds, the lines under it, and where the trace is with how
to open it.
"""

from __future__ import annotations

from jaxmnist.pages import esc, html_table
from jaxmnist.profiling.breakdown import HEADER, notes, table_rows

TITLE = "Where a step's time goes"


def profile_section(table: dict) -> tuple[str, str]:
    """(title, HTML) of the section for a profile table (`breakdown.breakdown`'s dict)."""
    rows = table_rows(table)
    lines = [
        f"{table['steps']} steady steps traced in {table.get('calls', 1)} call(s) on "
        f"{table.get('device', '?')}, {1e3 * table['step_seconds']:.3f} ms per step measured. "
        "Operations running at once share the time; host overhead is the measured time "
        "when no operation ran. FLOPs: "
        + table.get("flops_note", "the model's analytic count")
        + "; — where a kind's FLOPs are not known.",
        *notes(table),
    ]
    if table.get("trace"):
        lines.append(
            f"Trace: {table['trace']} (TensorBoard: tensorboard --logdir on this folder, with "
            "tensorboard-plugin-profile)"
            + (f"; {table['perfetto']} opens in ui.perfetto.dev" if table.get("perfetto") else "")
        )
    text = "".join(f"<p>{esc(line)}</p>" for line in lines)
    return TITLE, html_table(HEADER, rows, highlight={len(rows) - 1}) + text
