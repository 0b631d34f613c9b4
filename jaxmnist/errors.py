"""User-facing errors.

Everything a user can cause (bad files, bad arguments, missing data, a diverging
run) raises a subclass of `JaxmnistError`. The CLI turns these into one line on
stderr and an exit code; anything else is a bug in jaxmnist and keeps its
traceback.
"""

from __future__ import annotations


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


class WriteError(JaxmnistError):
    """A file could not be written here (disk full, no permission, name too long)."""

    @classmethod
    def from_os_error(cls, err: OSError, path) -> WriteError:
        """One line naming `path` and the cause; a full disk says so plainly."""
        import errno

        if err.errno in (errno.ENOSPC, errno.EDQUOT):
            return cls(f"disk full while writing {path}; free some space there and try again")
        return cls(f"cannot write {path}: {err.strerror or err}")


class NotARunError(ConfigError):
    """The path given names no run directory with a trained model: missing, not a run,
    or a run that has saved no parameters yet (exit 2, as any wrong argument)."""


class CorruptRunError(JaxmnistError):
    """A run directory whose files cannot be read back: a damaged config.json,
    params.npz or every checkpoint (exit 1, as corrupt data)."""
