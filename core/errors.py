"""Errors a user can act on. Each maps to a CLI exit code; none needs a traceback."""

from __future__ import annotations


class TrainflowError(Exception):
    """Base for errors caused by input, not by a bug. Not retried by tasks."""

    exit_code = 1


class ConfigError(TrainflowError):
    """The config (or an override) is invalid; the message names the key path."""


class DataValidationError(TrainflowError):
    """The dataset failed its expectation suite; ``report`` lists each failure."""

    exit_code = 2

    def __init__(self, message: str, report: dict | None = None):
        super().__init__(message)
        self.report = report or {}


class GateRejectedError(TrainflowError):
    """The candidate failed one or more gates; ``decision`` lists every reason."""

    exit_code = 3

    def __init__(self, message: str, decision: dict | None = None):
        super().__init__(message)
        self.decision = decision or {}


class TrainingFailedError(TrainflowError):
    """The torchrun job failed; the message names the failing rank and its traceback."""

    def __init__(self, message: str, rank: int | None = None, traceback: str = ""):
        super().__init__(message)
        self.rank = rank
        self.traceback = traceback


class DataUnavailableError(TrainflowError):
    """The DVC-tracked data is missing from the workspace."""

    @classmethod
    def not_pulled(cls, path, dvc_file: str | None = None) -> "DataUnavailableError":
        """``path`` (a file or folder the dataset needs) is not there: most likely never pulled."""
        tracked = f"The DVC-tracked data ({dvc_file})" if dvc_file else "The DVC-tracked data"
        return cls(f"{path} does not exist. {tracked} is missing from the workspace; run `dvc pull` "
                   "(or check dataset.path)")


class PreemptedError(TrainflowError):
    """Training stopped on SIGTERM after saving a checkpoint; the next run resumes from it."""

    exit_code = 4


class IntegrityError(TrainflowError):
    """A file about to be loaded is not the one recorded at registration (its sha256 differs, or
    none was recorded): it is refused before anything in it runs."""


class WorkspaceChangedError(TrainflowError):
    """A DVC-tracked folder differs from its ``.dvc`` file: the recorded data version would not be the
    data trained on. The message names the path, ``dvc add`` and ``dvc checkout``."""

    exit_code = 2
