"""User-facing errors.

Everything a user can cause (bad files, bad arguments, missing data, a diverging
run) raises a subclass of `JaxmnistError`. The CLI turns these into one line on
stderr and an exit code; anything else is a bug in jaxmnist and keeps its
traceback.
"""


class JaxmnistError(Exception):
    """An error the user can fix; `exit_code` is what the CLI exits with."""

    exit_code = 1


class ConfigError(JaxmnistError):
    """Invalid arguments or configuration, found before any work starts."""

    exit_code = 2


class DataError(JaxmnistError):
    """Data that is missing, corrupt, or does not match its checksum."""


class TrainingError(JaxmnistError):
    """Training went wrong in a way the user can act on (e.g. non-finite loss)."""


class TargetNotReached(JaxmnistError):
    """`--target-accuracy` was not reached; the run itself finished and was written."""

    exit_code = 3
