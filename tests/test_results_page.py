"""The Results page is written from the records (docs/hooks/results.py, headlines.py).

Every benchmark's folder under benchmarks/results/ has its section and every record its
link; the figures beside a record are that record's values (read and formatted here, not
through the page's readers); the newest record is the one measured last; and the page's
own prose, docs/results.md, types no figure.
"""

import importlib.util
import json
import logging
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
HOOKS = ROOT / "docs" / "hooks"


@pytest.fixture(scope="module")
def hook():
    """docs/hooks/results.py as MkDocs loads it: a file, beside the hooks it imports."""
    sys.path.insert(0, str(HOOKS))
    try:
        spec = importlib.util.spec_from_file_location("results_hook", HOOKS / "results.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # its dataclasses look their module up there
        spec.loader.exec_module(module)
    finally:
        sys.modules.pop("results_hook", None)
        sys.path.remove(str(HOOKS))
    return module


@pytest.fixture(scope="module")
def page(hook):
    return hook.page()


def section(page: str, folder: str, accelerator: bool = False) -> str:
    """The text of a benchmark's section, from its heading to the next heading."""
    anchor = folder.replace("/", "-") + ("-accelerator" if accelerator else "")
    start = page.index(f"{{#{anchor}}}")
    end = page.find("\n#", start)
    return page[start : end if end >= 0 else None]


def newest(text: str) -> dict:
    """The record a section's "Newest:" line links."""
    link = re.search(r"^Newest: .*?\[json\]\((benchmarks/results/[^)]+)\)", text, re.MULTILINE)
    return json.loads((ROOT / link.group(1)).read_text())


def test_every_folder_has_its_section_and_every_record_its_link(page):
    files = [p for p in RESULTS.rglob("*") if p.is_file()]
    folders = {p.parent.relative_to(RESULTS).as_posix() for p in files}
    assert len(folders) > 30  # the glob found the records
    missing = [f for f in sorted(folders) if f"### `{f}`" not in page]
    assert not missing, f"folders without a section on the Results page: {missing}"
    unlinked = [p.name for p in files if f"({p.relative_to(ROOT).as_posix()})" not in page]
    assert not unlinked, f"records the Results page does not link: {unlinked}"


def test_the_page_is_written_without_a_warning(hook, caplog):
    with caplog.at_level(logging.WARNING):
        hook.page()
    assert not caplog.records, [r.getMessage() for r in caplog.records]


def test_the_figures_are_the_newest_records_values(page):
    text = section(page, "startup")
    record = newest(text)
    assert f"| {record['slowest_median_seconds']:.3f} s (goal" in text

    text = section(page, "cnn_vs_pytorch")
    for row in newest(text)["results"]:
        assert f"| `{row['variant']}` | steady epoch {row['steady_epoch_seconds']:.2f} s" in text

    text = section(page, "memory_estimate")
    cases = newest(text)["cases"]
    assert f"| {sum(c['within_goal'] for c in cases)} of {len(cases)};" in text

    text = section(page, "seeds_vs_single")
    assert f"= {newest(text)['wall_ratio']:.2f}× (target" in text

    text = section(page, "tpu/time_to_result", accelerator=True)
    record = newest(text)
    assert f"= {record['cold_ratio']:.2f}× (target" in text
    assert f"= {record['warm_ratio']:.2f}× (target" in text


def test_the_newest_record_is_the_one_measured_last(page):
    folder = RESULTS / "tpu" / "time_to_result"  # records that keep their date and time
    records = [json.loads(p.read_text()) for p in folder.glob("*.json")]
    last = max(records, key=lambda r: r["provenance"]["date"])
    assert len({r["provenance"]["date"] for r in records}) > 1  # there is an order to find
    assert newest(section(page, "tpu/time_to_result", accelerator=True)) == last


def test_every_record_is_read_by_its_benchmarks_reader(hook):
    """Not the newest alone: any record of a folder may become the one shown (a record
    removed, the order of a day's records), so each folder's reader reads them all."""
    unread = []
    for folder, records in hook.collect().items():
        bench = hook.headlines.BENCHMARKS[folder]
        for record in records:
            if bench.figures is None:
                continue
            try:
                assert bench.figures(record.data)
            except (KeyError, TypeError, IndexError, AssertionError) as e:
                unread.append(f"{folder}/{record.stem}: {e!r}")
    assert not unread, unread


# Names that hold digits but state no figure.
NAMES = ("TPU 101", "TPU v5e")


def test_the_pages_own_prose_types_no_figure():
    text = (ROOT / "docs" / "results.md").read_text()
    text = re.sub(r"<!--.*?-->", "", text, flags=re.DOTALL)  # the generated parts' markers
    text = re.sub(r"`[^`]*`", "", text)  # code: commands, names, commits
    text = re.sub(r"\]\([^)]*\)", "]", text)  # links' targets
    for name in NAMES:
        text = text.replace(name, "")
    # A figure: a word of digits (and points, commas, signs) without a letter; `im2col`,
    # `float32` and the like are names.
    figure = re.compile(r"(?<![\w.])[-+−]?\d[\d.,]*(?![\w])")
    typed = [line for line in text.splitlines() if figure.search(line)]
    assert not typed, f"figures typed into docs/results.md: {typed}"
