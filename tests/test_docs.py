"""Every `jaxmnist …` command the docs and the README show is one that works.

The commands are the lines of their fenced code blocks that call `jaxmnist` (a shell's
`&&`, `|`, `;` and `&` separate commands on a line; `$NAME` takes the value a line of the
same block assigned; `...` and `…` stand for what the prose leaves out). Each must parse
as the `jaxmnist` command line parses it (`cli.main`'s rule for KEY=VALUE overrides
included), and a command that takes a config must resolve to a valid one: a renamed
option, key or preset fails here, not for a reader. The cheap ones run for real:
`jaxmnist config` and `--version` as written, and every `jaxmnist train` of an MLP as
written on the tiny dataset, for a few steps. The documentation's links to the
repository's files are checked by the strict docs build (`make docs`); the README's here.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import shlex
from pathlib import Path

import pytest

from jaxmnist import cli
from jaxmnist import config as config_lib
from jaxmnist.commands import options, search
from jaxmnist.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("**/*.md"))]
OPERATORS = {"&&", "||", "|", ";", "&"}
ELIDED = {"...", "…"}
# The flags a command reads itself rather than as config (its `resolve_config(args, ...)`).
LEFT_OUT = {"bench": ("--devices",), "search": search.LEFT_OUT}
SHELLS = {"sh", "bash", "shell", "console"}


def shell_commands(text: str) -> list[list[str]]:
    """The `jaxmnist` commands in the shell blocks (```sh, ```bash) of Markdown `text`,
    as argv lists without the program's name."""
    found, variables, fence, pending = [], {}, None, ""
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("```"):
            fence, variables = (None if fence is not None else line[3:].strip()), {}
            continue
        if fence not in SHELLS:
            continue
        line = f"{pending} {line}".strip() if pending else line
        if line.endswith("\\"):
            pending = line[:-1]
            continue
        pending = ""
        lexer = shlex.shlex(line, posix=True, punctuation_chars="&|;")
        lexer.whitespace_split, lexer.commenters = True, "#"
        words = list(lexer)
        assignment = re.fullmatch(r"(?:export\s+)?([A-Za-z_]\w*)=(.*)", line)
        if assignment and len(words) <= 2:
            # The shell's word splitting of the unquoted `$NAME` that uses it.
            variables[assignment.group(1)] = " ".join(shlex.split(assignment.group(2))).split()
            continue
        command: list[str] = []
        for word in [*words, ";"]:
            if word in OPERATORS:
                if command and Path(command[0]).name == "jaxmnist":
                    found.append([w for w in command[1:] if w not in ELIDED])
                command = []
            elif word.startswith("$") and word[1:] in variables:
                command += variables[word[1:]]
            else:
                command.append(word)
    return found


def documented() -> list[tuple[str, list[str]]]:
    return [
        (f"{page.relative_to(ROOT)}: jaxmnist {shlex.join(argv)}", argv)
        for page in PAGES
        for argv in shell_commands(page.read_text())
    ]


COMMANDS = documented()


def parse(argv: list[str]) -> argparse.Namespace:
    """`argv` parsed as `cli.main` parses it; argparse's errors raise SystemExit."""
    parser = cli.build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        if not hasattr(args, "overrides") or any(e.startswith("-") or "=" not in e for e in extra):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.overrides = [*args.overrides, *extra]
    return args


def test_the_docs_show_commands_of_every_kind():
    # The extraction itself: it finds the commands the pages are known to show.
    shown = {argv[0] for _, argv in COMMANDS if argv and not argv[0].startswith("-")}
    assert {"train", "eval", "predict", "export", "serve", "search", "sweep", "bench"} <= shown
    assert len(COMMANDS) > 60
    text = '```sh\nA="train --seed 3"\njaxmnist $A --epochs 1 | head -2  # note\n```\n'
    assert shell_commands(text) == [["train", "--seed", "3", "--epochs", "1"]]


@pytest.mark.parametrize("where,argv", COMMANDS, ids=[w for w, _ in COMMANDS])
def test_documented_command_parses(where, argv, capsys):
    if argv in (["--version"], ["--help"]):
        return  # argparse's own actions: they exit; run below
    try:
        args = parse(argv)
    except SystemExit:
        pytest.fail(f"{where}: does not parse: {capsys.readouterr().err.strip()}")
    if hasattr(args, "preset"):  # a ConfigError names the bad key or value
        options.resolve_config(args, LEFT_OUT.get(argv[0], ()))


def _mlp_trains() -> list[tuple[str, list[str]]]:
    """The documented `train` commands of an MLP in one process, one of each kind: the
    config they resolve to, and how they print."""
    out, seen = [], set()
    for where, argv in COMMANDS:
        if not argv or argv[0] != "train":
            continue
        try:
            args = parse(argv)
            cfg, _ = options.resolve_config(args)
        except (SystemExit, ConfigError):  # test_documented_command_parses says which
            continue
        if args.resume or args.coordinator or args.distributed or args.num_processes:
            continue
        kind = (json.dumps(cfg.to_dict(), sort_keys=True), args.json, args.quiet)
        if cfg.model.name == "mlp" and kind not in seen:
            seen.add(kind)
            out.append((where, argv))
    return out


def test_cheap_commands_run(capsys):
    for argv in (["--version"], *(a for _, a in COMMANDS if a and a[0] == "config")):
        try:
            assert cli.main(argv) == 0, argv
        except SystemExit as e:  # --version: argparse's action
            assert e.code == 0, argv
    assert "jaxmnist" in capsys.readouterr().out


MLP_TRAINS = _mlp_trains()


@pytest.mark.parametrize("where,argv", MLP_TRAINS, ids=[w for w, _ in MLP_TRAINS])
def test_documented_mlp_training_runs_on_tiny_data(where, argv, tiny_data_dir, tmp_path):
    # As written, then (later flags win) on the tiny dataset's 640 examples for 3 steps of
    # 32, into a scratch folder, on one device (the docs' meshes need 8); a target accuracy
    # low enough to be reached, so that the run's exit says it ran, not what 3 steps reach.
    tiny = ["--dataset", "tiny", "--data-dir", str(tiny_data_dir), "--steps", "3"]
    tiny += ["--batch-size", "32", "--run-dir", str(tmp_path / "run"), "--no-report"]
    tiny += ["--no-compile-cache", "--devices", "1", "parallel.mesh=none"]
    if "--target-accuracy" in argv or any(a.startswith("train.target_accuracy=") for a in argv):
        tiny.append("train.target_accuracy=0.01")
    assert cli.main([*argv, *tiny]) == 0, where


def test_readme_links_name_files_of_the_repository():
    text = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [t for t in targets if not re.match(r"[a-z]+:", t)]
    assert local, "the README links to no file: the pattern above is wrong"
    missing = [t for t in local if not (ROOT / t).exists()]
    assert not missing, f"the README links to files the repository lacks: {missing}"


NAMES = ("commands", "config", "presets")


def _reference():
    """docs/hooks/reference.py, the generator of the reference pages, as a module."""
    spec = importlib.util.spec_from_file_location("reference", ROOT / "docs/hooks/reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_reference_pages_name_every_command_option_key_and_preset():
    reference = _reference()
    commands, config, presets = (reference.PAGES[f"reference/{n}.md"]() for n in NAMES)
    parser = cli.build_parser()
    for name, sub in reference._subparsers(parser).items():
        assert f"## `jaxmnist {name}`" in commands
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction):
                continue  # -h, --help: every command's, left off the page
            for flag in action.option_strings:
                assert f"`{flag}" in commands or f", {flag}" in commands, (name, flag)
    for key in config_lib.field_names():
        assert f"| `{key}` |" in config, key
    for name in config_lib.PRESETS:
        assert f"## `{name}`" in presets and f"jaxmnist train --preset {name}\n" in presets


def test_every_config_key_says_what_it_means():
    # The meaning is the comment beside or above the field in its dataclass: a new field
    # without one fails here, not as a blank cell on the Config keys page.
    reference = _reference()
    for title, cls, instance in reference.config_keys():
        rows = reference._config_rows("", cls, instance)
        blank = [row.split("|")[1].strip() for row in rows if row.rstrip().endswith("|  |")]
        assert not blank, f"{title}: fields without a comment: {blank}"


def test_the_presets_page_says_what_each_preset_reached_and_where():
    reference = _reference()
    goals = reference.load_goals()
    page = reference.presets_page()
    measured = 0
    for name in config_lib.PRESETS:
        found = goals.preset_result(name)
        if found is None:
            continue
        figure, machine, date, commit, path = found
        assert path.is_file() and f"{figure}; {machine}, {date}, commit {commit}" in page
        measured += 1
    assert measured >= 5  # tpu101, the CNN presets and the record presets have records
