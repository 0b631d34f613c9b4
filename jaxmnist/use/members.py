"""Which model of a run is used: the ensemble of its members, or one of them (`--member`).

A run of several seeds (`--seeds N`) holds N members. `eval`, `predict`, `export` and
`serve` use them as one ensemble by default: its class probabilities are the mean of
the members' softmax probabilities. `--member I` (0-based) picks one member instead.
A run of one model is that model; `--member 0` names it too. This module imports
nothing that computes: the command parsers use it before anything heavy loads.
"""

from __future__ import annotations

from jaxmnist.errors import ConfigError

MEMBER_HELP = (
    "use member I of a run of several seeds (0-based: seed train.seed + I); default: the "
    "ensemble of every member (the mean of their softmax probabilities)"
)


def add_member_option(parser) -> None:
    """Adds `--member I` to a command that uses a run's model. It is read as text and
    checked once the run is read (`choose_member`), so any bad value is one line. Adds
    `--memory-budget-mb MB` too: what an ensemble's program may use (`use.chunks`)."""
    parser.add_argument("--member", metavar="I", help=MEMBER_HELP)
    parser.add_argument(
        "--memory-budget-mb",
        type=int,
        metavar="MB",
        help="device memory an ensemble may use; its members then run in as few chunks as "
        "fit (default: the run's memory_budget_mb, else the device's free memory)",
    )


def choose_member(text: str | int | None, members: int) -> int | None:
    """The member index `--member` names (`text`), for a run of `members` members;
    None means the ensemble of all of them (the default of a run of several). A run of
    one model gives 0. ConfigError (exit 2) for anything but an integer in 0..members-1."""
    if text is None:
        return None if members > 1 else 0
    what = "one model" if members == 1 else f"{members} members"
    try:
        index = int(str(text).strip(), 10)
    except ValueError:
        index = -1
    if not 0 <= index < members:
        raise ConfigError(
            f"--member {text}: must be a whole number within 0..{members - 1} (the run has {what})"
        )
    return index


def describe_ensemble(members: int) -> str:
    """How an ensemble of `members` combines them, in words (for headers and pages)."""
    return f"ensemble of {members}: the mean of its members' softmax probabilities"
