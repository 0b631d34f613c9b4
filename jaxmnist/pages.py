"""Self-contained HTML pages: the page template, its inline CSS, embedded images, tables.

Every page jaxmnist writes (a run's report.html, a comparison, a sweep's, a search's and
a benchmark's page, the profile's section of them) is built with this module, at the
bottom of the package so that any of them may use it. Each page is one file that opens
from disk with no network: styles are inline, images are `data:` URIs, there is no
script, and a Content-Security-Policy forbids loading anything else, so a stray external
reference fails closed instead of fetching. The layout is one readable column that
shrinks to a phone's width; wide tables scroll sideways inside their own box instead of
widening the page.

Stable API (other modules build pages with it): `render_page`, `embed_png`,
`html_table`, plus the small helpers `Raw`, `figure`, `figure_grid`, `cards`.
"""

from __future__ import annotations

import base64
import html
import re
import struct
from collections.abc import Container, Iterable
from importlib import metadata

# No network, no script: images only from data: URIs, styles only inline.
CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"

# A trailing backslash joins two source lines into one line of the served stylesheet.
CSS = """
:root { --fg: #1d2330; --muted: #5b6475; --line: #dde2ea; --bg: #ffffff; --panel: #f5f7fa;
  --accent: #1f5fbf; --hl: #fff4c2; --good: #17803d; --bad: #c62828; }
* { box-sizing: border-box; }
html { -webkit-text-size-adjust: 100%; text-size-adjust: 100%; }
body { margin: 0; background: var(--bg); color: var(--fg);
  font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, \
sans-serif; }
main { max-width: 1100px; margin: 0 auto; padding: 1.25rem 1rem 3rem; }
header h1 { font-size: 1.6rem; margin: 0 0 .25rem; line-height: 1.25; overflow-wrap: anywhere; }
header .subtitle { color: var(--muted); margin: 0 0 1rem; overflow-wrap: anywhere; }
nav.toc { display: flex; flex-wrap: wrap; gap: .35rem .9rem; padding: .6rem .8rem; \
margin: 0 0 1.5rem;
  background: var(--panel); border: 1px solid var(--line); border-radius: 8px; font-size: .92rem; }
nav.toc a { color: var(--accent); text-decoration: none; }
nav.toc a:hover { text-decoration: underline; }
section { margin: 0 0 2.2rem; }
h2 { font-size: 1.25rem; margin: 0 0 .75rem; padding-bottom: .3rem; \
border-bottom: 2px solid var(--line); }
h3 { font-size: 1.02rem; margin: 1.2rem 0 .5rem; }
p { margin: .4rem 0 .8rem; }
.note { color: var(--muted); font-size: .9rem; }
code, .mono { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, "Liberation Mono", \
monospace;
  font-size: .88em; }
pre { background: var(--panel); border: 1px solid var(--line); border-radius: 6px; \
padding: .6rem .8rem;
  overflow-x: auto; white-space: pre-wrap; overflow-wrap: anywhere; }
.table-wrap { overflow-x: auto; -webkit-overflow-scrolling: touch; margin: 0 0 1rem;
  border: 1px solid var(--line); border-radius: 8px; }
table { border-collapse: collapse; width: 100%; font-size: .9rem; \
font-variant-numeric: tabular-nums; }
th, td { padding: .38rem .65rem; border-bottom: 1px solid var(--line); text-align: left; \
vertical-align: top; }
thead th { background: var(--panel); font-weight: 600; white-space: nowrap; position: sticky; \
top: 0; }
tbody tr:last-child td, tbody tr:last-child th { border-bottom: 0; }
tbody tr:nth-child(even) td, tbody tr:nth-child(even) th { background: #fafbfc; }
td.num, th.num { text-align: right; white-space: nowrap; }
tbody th { text-align: left; font-weight: 600; white-space: nowrap; }
table.kv tbody th { color: var(--muted); font-weight: normal; width: 1%; }
table.kv td { overflow-wrap: break-word; min-width: 6.5rem; }
table.kv.pairs td { overflow-wrap: anywhere; min-width: 0; }
/* :nth-child(n) matches every row; it lifts the highlight above the even rows' stripes */
tbody tr:nth-child(n) .hl, tbody tr.hl:nth-child(n) td, tbody tr.hl:nth-child(n) th { \
background: var(--hl); }
.best { font-weight: 700; }
.good { color: var(--good); } .bad { color: var(--bad); }
figure { margin: 0 0 1.2rem; }
figure img { display: block; max-width: 100%; height: auto; margin: 0;
  border: 1px solid var(--line); border-radius: 8px; background: #fff; }
figcaption { color: var(--muted); font-size: .88rem; margin-top: .35rem; }
.grid { display: grid; grid-template-columns: repeat(auto-fit, minmax(min(100%, 460px), 1fr)); \
gap: 1rem 1.2rem; }
.cards { display: grid; grid-template-columns: repeat(auto-fit, minmax(9.5rem, 1fr)); gap: .7rem; \
margin: 0 0 1.5rem; }
.card { background: var(--panel); border: 1px solid var(--line); border-radius: 8px; \
padding: .6rem .8rem; }
.card .label { color: var(--muted); font-size: .8rem; text-transform: uppercase; \
letter-spacing: .04em; }
.card .value { font-size: 1.35rem; font-weight: 650; font-variant-numeric: tabular-nums; \
overflow-wrap: anywhere; }
footer { color: var(--muted); font-size: .82rem; border-top: 1px solid var(--line); \
padding-top: .8rem; }
@media (max-width: 600px) {
  body { font-size: 14px; }
  main { padding: .8rem .6rem 2rem; }
  header h1 { font-size: 1.3rem; }
  th, td { padding: .3rem .45rem; }
  .card .value { font-size: 1.1rem; }
}
@media print { nav.toc { display: none; } .table-wrap { overflow: visible; } }
"""


class Raw(str):
    """Trusted HTML: `html_table` and `cards` insert it as is instead of escaping it."""


def esc(value) -> str:
    """`value` as escaped text (a `Raw` passes through unchanged)."""
    if isinstance(value, Raw):
        return str(value)
    return html.escape("" if value is None else str(value))


def slug(text: str) -> str:
    """An HTML id from a heading: lower case, words joined by dashes."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "section"


def embed_png(png_bytes: bytes, alt: str) -> str:
    """An `<img>` whose source is `png_bytes` as a base64 data: URI (nothing fetched)."""
    if not png_bytes.startswith(b"\x89PNG\r\n\x1a\n"):
        raise ValueError("embed_png: not PNG data")
    width, height = struct.unpack(">II", png_bytes[16:24])  # the IHDR chunk
    data = base64.b64encode(png_bytes).decode("ascii")
    return (
        f'<img src="data:image/png;base64,{data}" width="{width}" height="{height}" '
        f'alt="{html.escape(alt)}">'
    )


def figure(png_bytes: bytes, alt: str, caption: str = "") -> str:
    """An embedded image with an optional caption (escaped text)."""
    cap = f"<figcaption>{esc(caption)}</figcaption>" if caption else ""
    return f"<figure>{embed_png(png_bytes, alt)}{cap}</figure>"


def figure_grid(items: Iterable[str]) -> str:
    """Figures side by side on a wide screen, stacked on a narrow one."""
    return '<div class="grid">' + "".join(items) + "</div>"


def cards(items: Iterable[tuple[str, object]]) -> str:
    """Headline numbers as a row of labelled cards: (label, value) pairs."""
    body = "".join(
        f'<div class="card"><div class="label">{esc(k)}</div>'
        f'<div class="value">{esc(v)}</div></div>'
        for k, v in items
    )
    return f'<div class="cards">{body}</div>'


_NUMBER = re.compile(r"^[-+−]?[\d,.]+(e[-+]?\d+)?\s*(%|s|ms|x|×)?$", re.IGNORECASE)


def _is_numeric(cell) -> bool:
    if isinstance(cell, bool):
        return False
    if isinstance(cell, (int, float)):
        return True
    return isinstance(cell, str) and not isinstance(cell, Raw) and bool(_NUMBER.match(cell.strip()))


def html_table(
    header: list[str],
    rows: list[list],
    highlight: Container[int | tuple[int, int]] | None = None,
    *,
    best: Container[tuple[int, int]] | None = None,
    kv: bool = False,
    row_headers: bool = True,
) -> str:
    """A table; every cell is escaped unless it is `Raw`. Numbers are right-aligned.

    `highlight` holds row indices (the whole row is highlighted) and/or
    `(row, column)` pairs (one cell); indices count data rows from 0. `best`
    holds `(row, column)` cells to set in bold. With `row_headers` the first
    column labels its row (`<th scope="row">`, left-aligned). `kv=True` styles a
    key/value table: muted keys, wrapping values, every column left-aligned
    (for runs side by side, too). Cells are shown with `str()`, so format numbers
    before passing them.
    """
    highlight = highlight if highlight is not None else ()
    best = best if best is not None else ()
    numeric_cols = [
        not kv
        and not (row_headers and j == 0)
        and bool(rows)
        and all(_is_numeric(r[j]) or r[j] in (None, "", "—") for r in rows)
        for j in range(len(header))
    ]
    head = "".join(
        f'<th scope="col"{" class=num" if numeric_cols[j] else ""}>{esc(h)}</th>'
        for j, h in enumerate(header)
    )
    body = []
    for i, row in enumerate(rows):
        cells = []
        for j, cell in enumerate(row):
            classes = []
            header_cell = row_headers and j == 0
            if (
                not kv
                and not header_cell
                and (_is_numeric(cell) or (j < len(numeric_cols) and numeric_cols[j]))
            ):
                classes.append("num")
            if (i, j) in highlight:
                classes.append("hl")
            if (i, j) in best:
                classes.append("best")
            cls = f' class="{" ".join(classes)}"' if classes else ""
            tag = 'th scope="row"' if header_cell else "td"
            cells.append(f"<{tag}{cls}>{esc(cell)}</{tag.split()[0]}>")
        row_cls = ' class="hl"' if i in highlight else ""
        body.append(f"<tr{row_cls}>{''.join(cells)}</tr>")
    # A key/value pair table breaks long values anywhere; with several value
    # columns, words stay whole and the table scrolls sideways instead.
    cls = (' class="kv pairs"' if len(header) == 2 else ' class="kv"') if kv else ""
    thead = f"<thead><tr>{head}</tr></thead>" if any(header) else ""
    return (
        f'<div class="table-wrap"><table{cls}>{thead}<tbody>{"".join(body)}</tbody></table></div>'
    )


def _version() -> str:
    try:
        return metadata.version("jaxmnist")
    except metadata.PackageNotFoundError:  # running from a source tree
        return "(source)"


def render_page(title: str, sections: list[tuple[str, str]], subtitle: str = "") -> str:
    """A complete self-contained HTML document.

    `sections` are `(heading, inner_html)` pairs, shown in order under `<h2>`
    headings with a table of contents at the top; `inner_html` is inserted as is.
    """
    ids, toc, body = set(), [], []
    for heading, inner in sections:
        sid, n = slug(heading), 1
        while sid in ids:
            n += 1
            sid = f"{slug(heading)}-{n}"
        ids.add(sid)
        toc.append(f'<a href="#{sid}">{esc(heading)}</a>')
        body.append(f'<section id="{sid}"><h2>{esc(heading)}</h2>{inner}</section>')
    sub = f'<p class="subtitle">{esc(subtitle)}</p>' if subtitle else ""
    nav = f'<nav class="toc" aria-label="Contents">{"".join(toc)}</nav>' if len(toc) > 1 else ""
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<meta name="generator" content="jaxmnist {esc(_version())}">'
        f"<title>{esc(title)}</title><style>{CSS}</style></head>\n"
        f"<body><main><header><h1>{esc(title)}</h1>{sub}</header>{nav}\n"
        + "\n".join(body)
        + f"\n<footer>Written by jaxmnist {esc(_version())}. "
        "This page is self-contained: it loads nothing from the network.</footer>"
        "</main></body></html>\n"
    )
