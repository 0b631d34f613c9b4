"""The reference pages, written from the code each time the docs are built.

Every command and option comes from the argparse parsers (`jaxmnist.cli.build_parser`),
every config key from the config dataclasses (`jaxmnist.config`, the model families of
`jaxmnist.models`), with its type, default, allowed values and meaning (the comment
beside or above the field in its source), and every preset from `config.PRESETS` (the
comment above it, and the keys it changes from the default). Nothing here is written
by hand, so the pages cannot drift from the code; `PAGES` maps each page's path under
docs/ to a function that returns its Markdown.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib.util
import inspect
import io
import sys
import textwrap
import tokenize
import typing
from pathlib import Path

from jaxmnist import cli
from jaxmnist import config as config_lib
from jaxmnist.data.registry import DATASETS
from jaxmnist.models import MODELS, family
from jaxmnist.models.conv import CHOICES as CONV_IMPLS
from jaxmnist.models.conv import PADDINGS

ROOT = Path(__file__).resolve().parents[2]


def load_goals():
    """benchmarks/goals.py, which reads the live goals and the presets' results from the
    newest records (loaded from its file: benchmarks/ is a folder of scripts)."""
    spec = importlib.util.spec_from_file_location("goals", ROOT / "benchmarks" / "goals.py")
    goals = importlib.util.module_from_spec(spec)
    sys.modules["goals"] = goals  # its dataclasses look their module up there
    try:
        spec.loader.exec_module(goals)
    finally:
        del sys.modules["goals"]
    return goals


# The allowed values of the keys that take one of a few names: the tuples the code checks
# against (`config.validate`, the families' `validate`).
CHOICES = {
    "data.dataset": tuple(DATASETS),
    "optimizer.name": config_lib.OPTIMIZERS,
    "optimizer.schedule": config_lib.SCHEDULES,
    "train.target_split": config_lib.TARGET_SPLITS,
    "model.name": tuple(MODELS),
    "model.activation": family.ACTIVATIONS,
    "model.dtype": family.DTYPES,
    "model.padding": PADDINGS,
    "model.conv_impl": CONV_IMPLS,
}


def _cell(text) -> str:
    """`text` as one Markdown table cell."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def _code(text) -> str:
    return f"`{text}`" if text not in ("", None) else ""


# ---- commands -----------------------------------------------------------------------


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _help_of(parser: argparse.ArgumentParser, name: str) -> str:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                if choice.dest == name:
                    return choice.help or ""
    return ""


def _option_rows(parser: argparse.ArgumentParser) -> list[str]:
    rows = []
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        if action.option_strings:
            name = ", ".join(action.option_strings)
            if action.nargs != 0:
                name += f" {action.metavar or action.dest.upper()}"
        else:
            name = action.metavar or action.dest
        default = action.default
        shown = "" if default in (None, argparse.SUPPRESS, False, []) else _code(default)
        choices = ", ".join(f"`{c}`" for c in action.choices) if action.choices else ""
        help_text = (action.help or "") % {"default": default, "prog": parser.prog}
        rows.append(f"| `{_cell(name)}` | {_cell(help_text)} | {_cell(shown)} | {choices} |")
    return rows


def commands_page() -> str:
    parser = cli.build_parser()
    out = [
        "# Commands",
        "",
        (
            "Every `jaxmnist` command and option, as the command line's own parsers declare "
            "them (this page is generated from them each time the docs are built). "
            "Commands that train also take `KEY=VALUE` overrides of any "
            "[config key](config.md), anywhere on the line."
        ),
        "",
    ]
    for name, sub in _subparsers(parser).items():
        out += _command_section(f"jaxmnist {name}", sub, _help_of(parser, name), level=2)
    return "\n".join(out) + "\n"


def _command_section(title: str, parser, help_text: str, level: int) -> list[str]:
    usage = parser.format_usage().removeprefix("usage: ").strip()
    out = [f"{'#' * level} `{title}`", ""]
    if help_text:
        out += [help_text[0].upper() + help_text[1:] + ".", ""]
    if parser.description:
        out += [parser.description, ""]
    out += ["```text", usage, "```", ""]
    rows = _option_rows(parser)
    if rows:
        out += ["| option | what | default | choices |", "| --- | --- | --- | --- |", *rows, ""]
    for name, sub in _subparsers(parser).items():
        out += _command_section(f"{title} {name}", sub, _help_of(parser, name), level + 1)
    return out


# ---- config keys --------------------------------------------------------------------


def _field_comments(cls) -> dict[str, str]:
    """Each field of dataclass `cls` -> the comments beside it and on the lines just
    above it, in its class's source."""
    source = inspect.getsource(cls)
    lines = source.splitlines()
    comments: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
    body = ast.parse(textwrap.dedent(source)).body[0].body
    out = {}
    for node in body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            above, line = [], node.lineno - 1
            while line >= 1 and lines[line - 1].strip().startswith("#"):
                above.insert(0, comments[line])
                line -= 1
            beside = [comments[n] for n in range(node.lineno, node.end_lineno + 1) if n in comments]
            out[node.target.id] = " ".join(above + beside)
    return out


def _type_name(typ) -> str:
    text = typ if isinstance(typ, str) else getattr(typ, "__name__", str(typ))
    return text.replace("typing.", "")


def _config_rows(prefix: str, cls, instance) -> list[str]:
    comments = {}
    for klass in reversed(cls.__mro__):
        if dataclasses.is_dataclass(klass):
            # A subclass's comment wins; a field it redeclares without one keeps its base's.
            comments |= {k: v for k, v in _field_comments(klass).items() if v}
    hints = typing.get_type_hints(cls)
    rows = []
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]) or f.name == "model":
            continue  # a section: its own table
        key = f"{prefix}{f.name}"
        default = getattr(instance, f.name)
        choices = ", ".join(f"`{c}`" for c in CHOICES.get(key, ()))
        annotation = f.type if isinstance(f.type, str) else _type_name(hints[f.name])
        rows.append(
            f"| `{key}` | `{_cell(annotation)}` | `{_cell(repr(default))}` | {choices} "
            f"| {_cell(comments.get(f.name, ''))} |"
        )
    return rows


HEADER = ["| key | type | default | allowed | meaning |", "| --- | --- | --- | --- | --- |"]


def config_keys() -> list[tuple[str, type, object]]:
    """(section title, dataclass, its default instance) for every table of the page."""
    cfg = config_lib.Config()
    tables = [("Top level", config_lib.Config, cfg)]
    for f in dataclasses.fields(config_lib.Config):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value) and f.name != "model":
            tables.append((f"`{f.name}.*`", type(value), value))
    for name in MODELS:
        model_cfg = config_lib.apply_overrides(cfg, {"model.name": name}).model
        tables.append((f"`model.*` with `model.name={name}`", type(model_cfg), model_cfg))
    return tables


def config_page() -> str:
    out = [
        "# Config keys",
        "",
        (
            "Every key of a run's config, from the config dataclasses (`jaxmnist/config.py`) and "
            "the model families' (`jaxmnist/models/`); generated each time the docs are built. "
            "Set any of them on a training command as `KEY=VALUE` (`optimizer.lr=3e-3`); "
            "`jaxmnist config` prints the resolved config. An unknown key or a value of the "
            "wrong type is an error before anything runs."
        ),
        "",
    ]
    for title, cls, instance in config_keys():
        prefix = "" if cls is config_lib.Config else title.split("`")[1].removesuffix("*")
        out += [f"## {title}", "", *HEADER, *_config_rows(prefix, cls, instance), ""]
    return "\n".join(out) + "\n"


# ---- presets ------------------------------------------------------------------------


def _preset_comments() -> dict[str, str]:
    """Each preset's name -> the comment lines just above it in `config.PRESETS`."""
    source = inspect.getsource(config_lib)
    lines = source.splitlines()
    out = {}
    for i, line in enumerate(lines):
        stripped = line.strip()
        for name in config_lib.PRESETS:
            if stripped.startswith(f'"{name}": '):
                above, j = [], i - 1
                while lines[j].strip().startswith("#"):
                    above.insert(0, lines[j].strip().lstrip("#").strip())
                    j -= 1
                out[name] = " ".join(above)
    return out


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out |= _flat(v, f"{prefix}{k}.")
        else:
            out[f"{prefix}{k}"] = v
    return out


def preset_changes(name: str) -> dict:
    """The keys preset `name` sets to a value other than the default config's (for the
    model, other than its family's defaults)."""
    preset_cfg = config_lib.get_preset(name)
    family_default = config_lib.apply_overrides(
        config_lib.Config(), {"model.name": preset_cfg.model.name}
    )
    default = _flat(config_lib.Config().to_dict()) | _flat({"model": family_default.model.__dict__})
    preset = _flat(preset_cfg.to_dict())
    return {k: v for k, v in preset.items() if default.get(k, object()) != v}


def _measured(preset: str, goals) -> str:
    found = goals.preset_result(preset)
    if found is None:
        return "**Measured**: no record holds this preset's result yet."
    figure, machine, date, commit, path = found
    where = path.relative_to(ROOT).as_posix()
    return f"**Measured**: {figure}; {machine}, {date}, commit {commit} ([record]({where}))."


def presets_page() -> str:
    comments, goals = _preset_comments(), load_goals()
    out = [
        "# Presets",
        "",
        (
            "Every preset of `jaxmnist/config.py`, with what it is for and the keys it changes "
            "from the default config, and what it reached in its newest record, on which "
            "machine, when and at which commit; generated each time the docs are built. Any "
            "flag or `KEY=VALUE` after `--preset` changes it further. The "
            "[Results](../results.md) page has every measurement."
        ),
        "",
    ]
    for name in config_lib.PRESETS:
        changes = preset_changes(name)
        out += [f"## `{name}`", "", comments.get(name, ""), "", "```sh"]
        out += [f"jaxmnist train --preset {name}", "```", "", _measured(name, goals), ""]
        if changes:
            out += ["| key | value |", "| --- | --- |"]
            out += [f"| `{k}` | `{_cell(repr(v))}` |" for k, v in changes.items()]
        else:
            out += ["The default config: it changes no key."]
        out.append("")
    return "\n".join(out) + "\n"


PAGES = {
    "reference/commands.md": commands_page,
    "reference/config.md": config_page,
    "reference/presets.md": presets_page,
}
