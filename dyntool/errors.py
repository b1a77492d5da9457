"""User-facing errors.

Everything a user can cause (bad config value, unknown key, missing data, unwritable
output directory, corrupt run) raises a ``DyntoolError`` subclass.  The CLI turns these
into one line on stderr and exit code 2; nothing else is ever shown as a traceback.
"""


class DyntoolError(Exception):
    """An error caused by input, reported as one line (exit code 2)."""

    exit_code = 2


class ConfigError(DyntoolError):
    """A bad config value or unknown key; the message names the key."""

    def __init__(self, key: str, message: str):
        self.key = key
        super().__init__(f"config error: {key}: {message}")


class RunError(DyntoolError):
    """A run directory that can't be created, read, or is corrupted."""


class StorageError(DyntoolError):
    """The storage failed while a run was being written (an object store that stayed unreachable
    past the retries): one line, exit code 1 (not a refusal); the run is marked failed."""

    exit_code = 1


class NonFiniteLossError(DyntoolError):
    """Training produced a NaN/inf loss; the run is marked failed, records kept."""

    exit_code = 3

    def __init__(self, step: int, detail: str = ""):
        self.step = step
        super().__init__(f"non-finite loss at step {step}{': ' + detail if detail else ''}; "
                         "run marked failed, everything recorded so far is kept")


class ExportError(DyntoolError):
    """Bad export request (format, array, steps, output directory) or a missing extra."""


class CaptureError(RuntimeError):
    """A model's attention can't be recorded exactly (raised by :class:`dyntool.Capture` and the
    adapters, one line naming why).  A RuntimeError, not a DyntoolError: it reaches the user's
    own training loop as an exception to handle; ``dyntool.capture.CaptureError`` is this class."""
