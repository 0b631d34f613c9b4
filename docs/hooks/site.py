"""MkDocs hooks: the generated reference pages, and links to the repository's files.

`on_files` adds the pages of `reference.PAGES`, written from the code at each build (they
are never committed, so they cannot go stale), and the repository's files the pages link
to: a link to a file outside docs/ (`benchmarks/results/record/...json`, written as from the
repository's root, as in the README) becomes, in `on_page_markdown`, a link to its copy
published with the site under `repo/` (a folder: a listing of its names). A link to a
path the repository lacks is a warning, which fails the strict build like any broken link.
`<!-- goals -->` in a page becomes the table of the live goals (`benchmarks/goals.py`),
read from the newest records as the site is built; `<!-- time_to_result -->` the TPU's
time to result and compile times, from the newest record that measured them all; and
`<!-- records -->` every benchmark's newest figures and its older records (`results.page`).
"""

from __future__ import annotations

import logging
import posixpath
import re
import sys
from pathlib import Path

from mkdocs.structure.files import File

sys.path.insert(0, str(Path(__file__).parent))  # MkDocs loads hooks as files, not a package
import reference
import results

log = logging.getLogger("mkdocs.hooks.site")
ROOT = Path(__file__).resolve().parents[2]
GOALS_MARKER = "<!-- goals -->"
TIME_TO_RESULT_MARKER = "<!-- time_to_result -->"
RECORDS_MARKER = "<!-- records -->"


# The top-level entries of the repository a page may link to, by their path from the root.
REPO_TOPS = ("benchmarks/", "jaxmnist/", "tests/", "native/", ".ci/", "Makefile", "pyproject.toml")
_goals = ""  # the goals table of this build (on_files)
_time_to_result = ""  # the TPU's time to result of this build (on_files)
_records = ""  # the records' sections of this build (on_files)
_TOPS = "|".join(re.escape(t) for t in REPO_TOPS)
LINK = re.compile(rf"\]\((?P<target>(?:{_TOPS})[^)\s#]*)(?P<anchor>#[^)\s]*)?\)")


def _linked_targets(docs_dir: Path, generated: str) -> set[str]:
    """The repository's files and folders the pages (and the `generated` text) link to."""
    texts = [generated, *(page.read_text() for page in docs_dir.rglob("*.md"))]
    return {m.group("target") for text in texts for m in LINK.finditer(text)}


def _published(target: str) -> str:
    """Where the site publishes repository path `target` (a folder: its listing)."""
    if (ROOT / target).is_dir():
        return posixpath.join("repo", target.rstrip("/"), "index.txt")
    return posixpath.join("repo", target)


def on_files(files, config):
    global _goals, _time_to_result, _records
    goals = reference.load_goals()
    _goals, _time_to_result = goals.table(), goals.time_to_result_table()
    _records = results.page()
    pages = {path: write() for path, write in reference.PAGES.items()}
    for path, content in pages.items():
        files.append(File.generated(config, path, content=content))
    generated = "\n".join([_goals, _time_to_result, _records, *pages.values()])
    for target in sorted(_linked_targets(Path(config.docs_dir), generated)):
        source = ROOT / target
        if source.is_dir():
            listing = "\n".join(sorted(p.name for p in source.iterdir())) + "\n"
            files.append(File.generated(config, _published(target), content=listing))
        elif source.is_file():
            files.append(File.generated(config, _published(target), abs_src_path=str(source)))
    return files


def on_page_markdown(markdown, page, config, files):
    markdown = markdown.replace(GOALS_MARKER, _goals).replace(RECORDS_MARKER, _records)
    markdown = markdown.replace(TIME_TO_RESULT_MARKER, _time_to_result)
    up = "../" * page.file.src_uri.count("/")

    def repl(m):
        target = m.group("target")
        if not (ROOT / target).exists():
            log.warning("%s links to %s, which the repository lacks", page.file.src_uri, target)
            return m.group(0)
        return f"]({up}{_published(target)}{m.group('anchor') or ''})"

    return LINK.sub(repl, markdown)
