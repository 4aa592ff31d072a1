"""User-facing errors.

Every error a user can cause (bad config, missing file, invalid request, shapes
that do not fit) is a `BlockdraftError`: a `ValueError` whose message names the
field and the values. Entry points print it as one line; nothing else should
reach the user as a traceback.
"""


class BlockdraftError(ValueError):
    """Base class for errors caused by input, not by a bug."""


class ConfigError(BlockdraftError):
    """A config field is missing, conflicting, unsupported or out of range."""


class CheckpointError(BlockdraftError):
    """A checkpoint file is missing, or its tensors do not match the config."""


class RequestError(BlockdraftError):
    """A generation request is invalid (prompt too long, bad sampling params, ...); `field` names the
    request field at fault (the server reports it as the OpenAI error's `param`)."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field
